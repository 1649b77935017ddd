package httpmetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// TestObserveWithoutSpanAllocatesNothing: a request without a sampled span costs the plain
// Observe it cost before exemplars (testing.AllocsPerRun refuses to run in parallel tests).
func TestObserveWithoutSpanAllocatesNothing(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "h"})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
	require.Zero(t, testing.AllocsPerRun(100, func() {
		observe(h, 0.1, trace.SpanContext{})
		observe(h, 0.1, unsampled)
	}))
}

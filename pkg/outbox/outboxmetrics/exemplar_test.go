package outboxmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
)

// sampled is the context of a sampled span.
var sampled = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

func TestRelayExemplars(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*prometheus.Registry, outbox.Hooks) {
		reg := prometheus.NewPedanticRegistry()
		m, err := outboxmetrics.NewRelay(reg, prometheus.Labels{"service": "test"})
		require.NoError(t, err)
		return reg, m.Hooks(outbox.Hooks{})
	}
	confirmed := time.Now()
	batch := func(spans ...trace.SpanContext) outbox.BatchResult {
		b := outbox.BatchResult{ConfirmedAt: confirmed, PublishedSpans: spans}
		for range max(len(spans), 1) {
			b.Published = append(b.Published, outbox.Message{CreatedAt: confirmed.Add(-30 * time.Millisecond)})
		}
		return b
	}

	t.Run("a row published under a sampled span carries its trace and span ids", func(t *testing.T) {
		t.Parallel()
		reg, hooks := setup(t)
		unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
		hooks.BatchDone(batch(sampled, unsampled, trace.SpanContext{}))

		ex := exemplars(t, reg, "outbox_commit_to_confirm_seconds")
		require.Len(t, ex, 1, "only the sampled span's observation")
		require.Equal(t, map[string]string{
			outboxmetrics.ExemplarTraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
			outboxmetrics.ExemplarSpanID:  "00f067aa0ba902b7",
		}, labels(ex[0]))
		require.InDelta(t, 0.03, ex[0].GetValue(), 1e-9)
	})

	t.Run("without span contexts no exemplar", func(t *testing.T) {
		t.Parallel()
		reg, hooks := setup(t)
		hooks.BatchDone(batch())
		require.Empty(t, exemplars(t, reg, "outbox_commit_to_confirm_seconds"))
	})
}

// TestRelayExemplarsAllocations: without tracing, the metrics hook allocates nothing per
// batch (testing.AllocsPerRun refuses to run in parallel tests).
func TestRelayExemplarsAllocations(t *testing.T) {
	m, err := outboxmetrics.NewRelay(prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	hooks := m.Hooks(outbox.Hooks{})
	now := time.Now()
	b := outbox.BatchResult{ConfirmedAt: now, Published: []outbox.Message{{CreatedAt: now.Add(-time.Millisecond)}, {CreatedAt: now}}}
	require.Zero(t, testing.AllocsPerRun(100, func() { hooks.BatchDone(b) }))
}

// exemplars returns the exemplars of the histogram name's buckets.
func exemplars(t *testing.T, g prometheus.Gatherer, name string) []*dto.Exemplar {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var out []*dto.Exemplar
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if e := b.GetExemplar(); e != nil {
					out = append(out, e)
				}
			}
		}
		return out
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func labels(e *dto.Exemplar) map[string]string {
	m := map[string]string{}
	for _, l := range e.GetLabel() {
		m[l.GetName()] = l.GetValue()
	}
	return m
}

package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/logging"
)

func TestTraceIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New(&buf, "json", "info", "orders")
	require.NoError(t, err)
	log = log.With("mode", "api").WithGroup("req")

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "with a span", "id", 1)
	log.InfoContext(context.Background(), "without a span", "id", 2)
	log.Info("without a context", "id", 3)

	var lines []map[string]any
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var m map[string]any
		require.NoError(t, dec.Decode(&m))
		lines = append(lines, m)
	}
	require.Len(t, lines, 3)
	require.Equal(t, "orders", lines[0]["service"])
	require.Equal(t, "api", lines[0]["mode"])
	require.Equal(t, map[string]any{
		"id": float64(1), "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
	}, lines[0]["req"], "inside the group the record's attributes are in")
	for _, l := range lines[1:] {
		require.NotContains(t, l["req"], "trace_id")
		require.NotContains(t, l, "trace_id")
	}
}

package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// TestProcessTracing: Process makes no span, marks a duplicate on the span of its ctx, and
// hands fn that ctx.
func TestProcessTracing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newMigratedPool(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	msg := inbox.Message{ID: "m-1", Type: "order.placed"}

	process := func() (sdktrace.ReadOnlySpan, bool) {
		sctx, span := tp.Tracer("test").Start(ctx, "process")
		var fnSpan bool
		duplicate, err := inbox.Process(sctx, pool, "projection", msg, func(ctx context.Context, tx pgx.Tx) error {
			_, child := tp.Tracer("test").Start(ctx, "work")
			fnSpan = child.SpanContext().TraceID() == span.SpanContext().TraceID()
			child.End()
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, fnSpan, !duplicate)
		span.End()
		ended := rec.Ended()
		return ended[len(ended)-1], duplicate
	}

	first, duplicate := process()
	require.False(t, duplicate)
	for _, kv := range first.Attributes() {
		require.NotEqual(t, inbox.AttrDuplicate, kv.Key)
	}
	second, duplicate := process()
	require.True(t, duplicate)
	require.Contains(t, second.Attributes(), inbox.AttrDuplicate.Bool(true))
	require.Len(t, rec.Ended(), 3, "process, work, process: the duplicate has no child")
}

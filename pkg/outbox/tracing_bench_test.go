package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// tracingModes are the three ways an application runs the outbox: without tracing (no
// provider configured: the global one, which makes no spans), with a no-op provider, and
// with a recording SDK provider (spans sampled and recorded, exported nowhere).
var tracingModes = []struct {
	name string
	tp   func() trace.TracerProvider // nil: the relay's default, the global provider
}{
	{"off", nil},
	{"noop", func() trace.TracerProvider { return noop.NewTracerProvider() }},
	{"recording", func() trace.TracerProvider { return sdktrace.NewTracerProvider() }},
}

// discardTx is a DBTX that runs nothing, so that a benchmark of Add measures its Go side.
type discardTx struct{}

func (discardTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, nil
}
func (discardTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, nil }
func (discardTx) QueryRow(context.Context, string, ...any) pgx.Row        { return nil }

// BenchmarkAddTracing measures Add's own cost (no database) when the caller's ctx carries
// no span (off), a no-op provider's span, or a recording span whose context Add writes into
// the headers (traceparent through the global W3C propagator TestMain installs).
func BenchmarkAddTracing(b *testing.B) {
	m := outbox.Message{Exchange: "orders", RoutingKey: "order.created", Type: "OrderCreated",
		AggregateType: "order", AggregateID: "42", Payload: []byte(`{"order_id":"42","total":1999}`),
		Headers: map[string]string{outbox.HeaderCorrelationID: "c-42"}}
	for _, mode := range tracingModes {
		b.Run(mode.name, func(b *testing.B) {
			ctx := context.Background()
			if mode.tp != nil {
				var span trace.Span
				ctx, span = mode.tp().Tracer("bench").Start(ctx, "request")
				defer span.End()
			}
			b.ReportAllocs()
			for b.Loop() {
				m.ID = [16]byte{}
				if err := outbox.Add(ctx, discardTx{}, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelayDrainTracing is BenchmarkRelayDrain in each tracing mode, with rows written
// under a recording span (so that each carries a traceparent for the relay to read).
func BenchmarkRelayDrainTracing(b *testing.B) {
	for _, mode := range tracingModes {
		b.Run(mode.name, func(b *testing.B) {
			bb := setup(b)
			ctx := context.Background()
			cfg := outbox.Config{BatchSize: 500, DisableNotify: true}
			if mode.tp != nil {
				cfg.TracerProvider = mode.tp()
			}
			r, err := outbox.NewRelay(bb.pool, bb.pub, cfg)
			require.NoError(b, err)
			wctx, span := sdktrace.NewTracerProvider().Tracer("bench").Start(ctx, "request")
			defer span.End()
			const rows = 5000
			var drained int
			for b.Loop() {
				b.StopTimer()
				batch := make([]outbox.Message, rows)
				for i := range batch {
					batch[i] = bb.msg(fmt.Sprint(i), i)
				}
				require.NoError(b, pgx.BeginFunc(wctx, bb.pool, func(tx pgx.Tx) error { return outbox.Add(wctx, tx, batch...) }))
				b.StartTimer()
				for {
					n, err := r.PublishBatch(ctx)
					require.NoError(b, err)
					drained += n
					if n == 0 {
						break
					}
				}
			}
			b.ReportMetric(float64(drained)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkCycleTracing is a relay cycle of 100 rows with a publisher that confirms at once
// (the database's work and the relay's, no broker), in each tracing mode: the spans' share
// of a cycle, reported as ns/row.
func BenchmarkCycleTracing(b *testing.B) {
	for _, mode := range tracingModes {
		b.Run(mode.name, func(b *testing.B) {
			bb := setup(b)
			ctx := context.Background()
			const batch = 100
			cfg := outbox.Config{BatchSize: batch, DisableNotify: true}
			if mode.tp != nil {
				cfg.TracerProvider = mode.tp()
			}
			r, err := outbox.NewRelay(bb.pool, confirmAll{}, cfg)
			require.NoError(b, err)
			wctx, span := sdktrace.NewTracerProvider().Tracer("bench").Start(ctx, "request")
			defer span.End()
			msgs := make([]outbox.Message, batch)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for j := range msgs {
					msgs[j] = bb.msg(fmt.Sprintf("%d-%d", i, j), j)
				}
				require.NoError(b, pgx.BeginFunc(wctx, bb.pool, func(tx pgx.Tx) error { return outbox.Add(wctx, tx, msgs...) }))
				b.StartTimer()
				n, err := r.PublishBatch(ctx)
				require.NoError(b, err)
				require.Equal(b, batch, n)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/row")
		})
	}
}

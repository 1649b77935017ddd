package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// TestTracingHostile: what callers and brokers do wrong does not break the trace context's
// way through the outbox.
func TestTracingHostile(t *testing.T) {
	t.Parallel()

	t.Run("a garbage traceparent the caller set is published under a new trace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		m := b.msg("order-1", 1)
		m.Headers = map[string]string{outbox.HeaderTraceparent: "00-garbage-garbage-zz"}
		b.write(t, m)

		b.startRelay(t, b.pool, b.pub, tr.config(t))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 && len(tr.publishSpans()) == 1 }, "published and traced")
		s := tr.publishSpans()[0]
		require.False(t, s.Parent().IsValid(), "a root span")
		require.Equal(t, s.SpanContext().TraceID(), deliveryContext(got.all()[0]).TraceID())
		require.Equal(t, 0, b.count(t, "dead_at IS NOT NULL"))
	})

	t.Run("baggage over the header limit fails Add, not the relay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		// OpenTelemetry's own baggage stops at 8192 bytes; a propagator of another kind need not.
		store, err := outbox.NewStore(outbox.Tables{})
		require.NoError(t, err)
		store = store.WithPropagator(hugeBaggage{})
		member, err := baggage.NewMember("tenant", "acme")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		ctx, span := tr.tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), bag), "request")
		defer span.End()
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return store.Add(ctx, tx, b.msg("order-1", 1)) })
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		require.Contains(t, err.Error(), "Headers")
		require.Equal(t, 0, b.count(t, "true"))
	})

	t.Run("spans end exactly once through a broker outage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
		m := b.msg("order-1", 1)
		b.addIn(t, ctx, &m)
		request.End()

		// A broker that is not there: every cycle finds it unavailable.
		down := newPublisher(t, "amqp://guest:guest@127.0.0.1:1/")
		ctxRelay, cancel := context.WithCancel(context.Background())
		r, err := outbox.NewRelay(b.pool, down, tr.config(t))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- r.Run(ctxRelay) }()
		testinfra.Eventually(t, waitFor, func() bool { return len(tr.publishSpans()) >= 5 }, "several cycles traced")
		cancel()
		require.NoError(t, <-done)

		started := 0
		for _, s := range tr.rec.Started() {
			if strings.HasPrefix(s.Name(), "publish") {
				started++
			}
		}
		require.Equal(t, started, len(tr.publishSpans()), "every started publish span ended")
		seen := map[trace.SpanID]bool{}
		for _, s := range tr.publishSpans() {
			require.False(t, seen[s.SpanContext().SpanID()], "a span ended twice")
			seen[s.SpanContext().SpanID()] = true
			require.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID())
		}
		require.Equal(t, 0, b.count(t, "attempts > 0 OR dead_at IS NOT NULL"), "an outage counts no attempt")
	})
}

// hugeBaggage writes a baggage header over MaxHeaderBytes.
type hugeBaggage struct{}

func (hugeBaggage) Inject(_ context.Context, c propagation.TextMapCarrier) {
	c.Set(outbox.HeaderBaggage, "k="+strings.Repeat("v", outbox.MaxHeaderBytes))
}
func (hugeBaggage) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}
func (hugeBaggage) Fields() []string { return []string{outbox.HeaderBaggage} }

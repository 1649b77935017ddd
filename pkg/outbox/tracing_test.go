package outbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// w3c is the propagator TestMain installs globally, as an application using OpenTelemetry
// does: Add reads the global one.
var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracing is a recording tracer provider and its recorder.
type tracing struct {
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
}

func newTracing(t *testing.T) tracing {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing{rec: rec, tp: tp}
}

// publishSpans returns the ended publish spans.
func (tr tracing) publishSpans() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.rec.Ended() {
		if strings.HasPrefix(s.Name(), "publish") {
			out = append(out, s)
		}
	}
	return out
}

// config is fastConfig with tr's provider.
func (tr tracing) config(t *testing.T) outbox.Config {
	cfg := fastConfig(t)
	cfg.TracerProvider = tr.tp
	cfg.Propagator = w3c
	return cfg
}

// rowHeaders reads the stored headers of the row id.
func (b *bundle) rowHeaders(t *testing.T, m outbox.Message) map[string]string {
	t.Helper()
	var h map[string]string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT headers FROM outbox_messages WHERE id = $1", m.ID).Scan(&h))
	return h
}

// addIn adds msg in a committed transaction under ctx.
func (b *bundle) addIn(t *testing.T, ctx context.Context, msg *outbox.Message) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		msgs := []outbox.Message{*msg}
		err := outbox.Add(ctx, tx, msgs...)
		*msg = msgs[0]
		return err
	}))
}

// deliveryContext extracts the trace context a delivery carries.
func deliveryContext(d amqp.Delivery) trace.SpanContext {
	c := propagation.MapCarrier{}
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			c[k] = s
		}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracing(t *testing.T) {
	t.Parallel()

	t.Run("Add records the caller's trace context and baggage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		member, err := baggage.NewMember("tenant", "acme")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		ctx, span := tr.tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), bag), "request")
		defer span.End()

		m := b.msg("order-1", 1)
		m.Headers = map[string]string{outbox.HeaderCorrelationID: "c-1"}
		b.addIn(t, ctx, &m)

		h := b.rowHeaders(t, m)
		stored := trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier(h)))
		require.Equal(t, span.SpanContext().TraceID(), stored.TraceID())
		require.Equal(t, span.SpanContext().SpanID(), stored.SpanID())
		require.Equal(t, "tenant=acme", h[outbox.HeaderBaggage])
		require.Equal(t, "c-1", h[outbox.HeaderCorrelationID])
		require.Equal(t, map[string]string{outbox.HeaderCorrelationID: "c-1"}, m.Headers, "the caller's map is not changed")
	})

	t.Run("a traceparent the caller set is kept", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		ctx, span := tr.tp.Tracer("test").Start(context.Background(), "request")
		defer span.End()
		const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

		m := b.msg("order-1", 1)
		m.Headers = map[string]string{outbox.HeaderTraceparent: own}
		b.addIn(t, ctx, &m)

		h := b.rowHeaders(t, m)
		require.Equal(t, own, h[outbox.HeaderTraceparent])
		require.NotContains(t, h, outbox.HeaderTracestate)
	})

	t.Run("a store's propagator replaces the global one", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		member, err := baggage.NewMember("tenant", "acme")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		ctx, span := tr.tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), bag), "request")
		defer span.End()
		store, err := outbox.NewStore(outbox.Tables{})
		require.NoError(t, err)
		store = store.WithPropagator(propagation.Baggage{}) // baggage only

		m := b.msg("order-1", 1)
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			msgs := []outbox.Message{m}
			err := store.Add(ctx, tx, msgs...)
			m = msgs[0]
			return err
		}))
		h := b.rowHeaders(t, m)
		require.Equal(t, "tenant=acme", h[outbox.HeaderBaggage])
		require.NotContains(t, h, outbox.HeaderTraceparent)

		queued := []outbox.Message{b.msg("order-2", 1)}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var batch pgx.Batch
			if err := store.QueueAdd(ctx, &batch, queued...); err != nil {
				return err
			}
			return tx.SendBatch(ctx, &batch).Close()
		}))
		h = b.rowHeaders(t, queued[0])
		require.Equal(t, "tenant=acme", h[outbox.HeaderBaggage], "QueueAdd: the store's propagator too")
		require.NotContains(t, h, outbox.HeaderTraceparent)
	})

	t.Run("without a span Add records nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		m := b.msg("order-1", 1)
		b.addIn(t, context.Background(), &m)
		require.Empty(t, b.rowHeaders(t, m))
	})

	t.Run("the publish span is a child of the context captured at Add", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
		m := b.msg("order-1", 1)
		b.addIn(t, ctx, &m)
		request.End()

		b.startRelay(t, b.pool, b.pub, tr.config(t))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 && len(tr.publishSpans()) == 1 }, "published and traced")

		s := tr.publishSpans()[0]
		require.Equal(t, "publish "+b.top.Exchange, s.Name())
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID(), "one trace")
		require.Equal(t, request.SpanContext().SpanID(), s.Parent().SpanID())
		require.Equal(t, codes.Unset, s.Status().Code)
		a := attrs(s)
		require.Equal(t, "rabbitmq", a["messaging.system"].AsString())
		require.Equal(t, "send", a["messaging.operation.type"].AsString())
		require.Equal(t, b.top.Exchange, a["messaging.destination.name"].AsString())
		require.Equal(t, m.RoutingKey, a["messaging.rabbitmq.destination.routing_key"].AsString())
		require.Equal(t, m.ID.String(), a["messaging.message.id"].AsString())
		require.Equal(t, int64(1), a["messaging.batch.message_count"].AsInt64())
		require.Equal(t, "published", a[outbox.AttrOutcome].AsString())
		require.Equal(t, int64(1), a[outbox.AttrAttempt].AsInt64())
		require.GreaterOrEqual(t, a[outbox.AttrWaitMS].AsFloat64(), 0.0)
		require.NotEmpty(t, a[outbox.AttrCreatedAt].AsString())
		var events []string
		for _, e := range s.Events() {
			events = append(events, e.Name)
		}
		require.Equal(t, []string{outbox.EventSent, outbox.EventConfirmed}, events)

		// The message carries the publish span's context, for the consumer's span to nest under.
		require.Equal(t, s.SpanContext().SpanID(), deliveryContext(got.all()[0]).SpanID())
		require.Equal(t, s.SpanContext().TraceID(), deliveryContext(got.all()[0]).TraceID())
	})

	t.Run("a message without trace headers starts a new trace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		b.write(t, b.msg("order-1", 1))

		b.startRelay(t, b.pool, b.pub, tr.config(t))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 && len(tr.publishSpans()) == 1 }, "published and traced")

		s := tr.publishSpans()[0]
		require.False(t, s.Parent().IsValid(), "a root span")
		require.Equal(t, codes.Unset, s.Status().Code)
		require.Equal(t, s.SpanContext().TraceID(), deliveryContext(got.all()[0]).TraceID())
	})

	t.Run("BatchDone carries the publish spans' contexts, for exemplars", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
		traced := b.msg("order-1", 1)
		b.addIn(t, ctx, &traced)
		request.End()
		sampler := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		t.Cleanup(func() { _ = sampler.Shutdown(context.Background()) })
		ctx, unsampled := sampler.Tracer("test").Start(context.Background(), "request")
		untraced := b.msg("order-2", 1)
		b.addIn(t, ctx, &untraced)
		unsampled.End()

		cfg := tr.config(t) // the SDK's default sampler is parent-based: order-2's publish span is not sampled
		results := make(chan outbox.BatchResult, 2)
		cfg.Hooks.BatchDone = func(r outbox.BatchResult) { results <- r }
		relay, err := outbox.NewRelay(b.pool, b.pub, cfg)
		require.NoError(t, err)
		n, err := relay.PublishBatch(context.Background())
		require.NoError(t, err)
		require.Equal(t, 2, n)

		r := <-results
		require.Len(t, r.Published, 2)
		require.Len(t, r.PublishedSpans, 2)
		spans := map[string]trace.SpanContext{}
		for _, s := range tr.publishSpans() {
			spans[attrs(s)["messaging.message.id"].AsString()] = s.SpanContext()
		}
		for i, m := range r.Published {
			switch m.ID {
			case traced.ID:
				require.True(t, r.PublishedSpans[i].IsSampled())
				require.Equal(t, spans[m.ID.String()], r.PublishedSpans[i], "the publish span's context")
				require.Equal(t, request.SpanContext().TraceID(), r.PublishedSpans[i].TraceID())
			case untraced.ID:
				require.Equal(t, trace.SpanContext{}, r.PublishedSpans[i], "an unsampled span leaves the zero context")
			}
		}
	})

	t.Run("without tracing BatchDone carries no span contexts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.write(t, b.msg("order-1", 1))
		cfg := fastConfig(t)
		results := make(chan outbox.BatchResult, 1)
		cfg.Hooks.BatchDone = func(r outbox.BatchResult) { results <- r }
		relay, err := outbox.NewRelay(b.pool, b.pub, cfg)
		require.NoError(t, err)
		_, err = relay.PublishBatch(context.Background())
		require.NoError(t, err)
		r := <-results
		require.Len(t, r.Published, 1)
		require.Nil(t, r.PublishedSpans)
	})

	t.Run("a failed message's span has the error class", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		cfg := tr.config(t)
		cfg.MaxMessageBytes = 8
		b.write(t, b.msg("order-1", 1))

		b.startRelay(t, b.pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return len(tr.publishSpans()) == 1 }, "traced")

		s := tr.publishSpans()[0]
		require.Equal(t, codes.Error, s.Status().Code)
		a := attrs(s)
		require.Equal(t, "too_large", a["error.type"].AsString())
		require.Equal(t, "dead", a[outbox.AttrOutcome].AsString())
	})
}

// TestTracingRelayKilled: the context captured at Add lives in the row, so a relay killed
// after the broker confirmed the batch, and the relay that publishes it again, put both
// copies in the caller's trace.
func TestTracingRelayKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tr := newTracing(t)
	got := consume(t, b.amqpURL, b.top.Queue)
	ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
	m := b.msg("order-1", 1)
	b.addIn(t, ctx, &m)
	request.End()

	killedRelay(t, b.pool.Config().ConnString(), b.amqpURL, outbox.FailpointAfterPublish)
	require.Equal(t, 1, b.count(t, "published_at IS NULL"), "the killed relay's transaction rolled back")

	b.startRelay(t, b.pool, b.pub, tr.config(t))
	testinfra.Eventually(t, waitFor, func() bool { return got.len() == 2 && len(tr.publishSpans()) == 1 }, "published twice, traced once here")

	want := request.SpanContext().TraceID()
	for _, d := range got.all() {
		require.Equal(t, m.ID.String(), d.MessageId)
		require.Equal(t, want, deliveryContext(d).TraceID(), "each copy is in the caller's trace")
	}
	s := tr.publishSpans()[0]
	require.Equal(t, want, s.SpanContext().TraceID())
	require.Equal(t, request.SpanContext().SpanID(), s.Parent().SpanID())

	var h json.RawMessage
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT headers FROM outbox_messages WHERE id = $1", m.ID).Scan(&h))
	require.Contains(t, string(h), request.SpanContext().SpanID().String(), "the row keeps the context captured at Add")
}

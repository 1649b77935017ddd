package inboxrabbitmq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

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

// named returns the ended spans whose name starts with prefix.
func (tr tracing) named(prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.rec.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// config is the bundle's config traced by tr.
func (tr tracing) config(b *bundle, h inboxrabbitmq.Handler) inboxrabbitmq.Config {
	cfg := b.config(h)
	cfg.TracerProvider = tr.tp
	cfg.Propagator = w3c
	return cfg
}

// tracedMessage is jsonMessage(id) carrying the context of a producer span it starts and
// ends.
func (tr tracing) tracedMessage(id string) (amqp.Publishing, trace.SpanContext) {
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	ctx, span := tr.tp.Tracer("test").Start(ctx, "publish test", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	msg := jsonMessage(id)
	msg.Headers = amqp.Table{}
	for k, v := range carrier {
		msg.Headers[k] = v
	}
	return msg, span.SpanContext()
}

// workHandler records an effect under a span of its own, from the handler's ctx, with the
// baggage it found there as an attribute.
func (tr tracing) workHandler(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
	ctx, span := tr.tp.Tracer("handler").Start(ctx, "work",
		trace.WithAttributes(attribute.String("tenant", baggage.FromContext(ctx).Member("tenant").Value())))
	defer span.End()
	return recordEffect(ctx, tx, d)
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracing(t *testing.T) {
	t.Parallel()

	t.Run("the handler runs under a process span, child of the delivery's context", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		b.run(t, tr.config(b, tr.workHandler))
		msg, producer := tr.tracedMessage("m-1")
		b.publish(t, msg)
		testinfra.Eventually(t, 30*time.Second, func() bool { return len(tr.named("process")) == 1 }, "traced")

		s := tr.named("process")[0]
		require.Equal(t, "process "+b.top.Queue, s.Name())
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		require.Equal(t, producer.TraceID(), s.SpanContext().TraceID())
		require.Equal(t, producer.SpanID(), s.Parent().SpanID())
		require.Equal(t, codes.Unset, s.Status().Code)
		a := spanAttrs(s)
		require.Equal(t, "rabbitmq", a["messaging.system"].AsString())
		require.Equal(t, "process", a["messaging.operation.type"].AsString())
		require.Equal(t, b.top.Exchange, a["messaging.destination.name"].AsString())
		require.Equal(t, b.top.Queue, a["messaging.destination.subscription.name"].AsString())
		require.Equal(t, routingKey, a["messaging.rabbitmq.destination.routing_key"].AsString())
		require.Equal(t, "m-1", a["messaging.message.id"].AsString())
		require.Equal(t, "orders-projection", a[inboxrabbitmq.AttrConsumer].AsString())
		require.Equal(t, int64(1), a[inboxrabbitmq.AttrDeliveryCount].AsInt64())
		require.Equal(t, inboxrabbitmq.OutcomeProcessed, a[inboxrabbitmq.AttrOutcome].AsString())

		work := tr.named("work")
		require.Len(t, work, 1)
		require.Equal(t, s.SpanContext().SpanID(), work[0].Parent().SpanID(), "the handler's span nests under the process span")
		require.Equal(t, "acme", spanAttrs(work[0])["tenant"].AsString(), "the handler's ctx has the message's baggage")
	})

	t.Run("a duplicate is marked and has no child work", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		b.run(t, tr.config(b, tr.workHandler))
		msg, producer := tr.tracedMessage("m-1")
		b.publish(t, msg)
		testinfra.Eventually(t, 30*time.Second, func() bool { return len(tr.named("process")) == 1 }, "first traced")
		b.publish(t, msg)
		testinfra.Eventually(t, 30*time.Second, func() bool { return len(tr.named("process")) == 2 }, "duplicate traced")

		dup := tr.named("process")[1]
		require.Equal(t, producer.TraceID(), dup.SpanContext().TraceID())
		a := spanAttrs(dup)
		require.Equal(t, inboxrabbitmq.OutcomeDuplicate, a[inboxrabbitmq.AttrOutcome].AsString())
		require.True(t, a[inbox.AttrDuplicate].AsBool())
		require.Len(t, tr.named("work"), 1, "the handler ran once")
		require.Equal(t, 1, b.effects(t, "m-1"))
	})

	t.Run("Processed carries the process span's context, for exemplars", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		cfg := tr.config(b, tr.workHandler)
		processed := make(chan inboxrabbitmq.ProcessedMessage, 2)
		cfg.Hooks.Processed = func(e inboxrabbitmq.ProcessedMessage) { processed <- e }
		b.run(t, cfg)
		msg, _ := tr.tracedMessage("m-1")
		b.publish(t, msg)
		b.publish(t, msg) // a duplicate: its own process span
		for range 2 {
			e := <-processed
			require.True(t, e.SpanContext.IsSampled())
			found := false // the hook runs once the span ended
			for _, s := range tr.named("process") {
				found = found || s.SpanContext().Equal(e.SpanContext)
			}
			require.True(t, found, "the context of a process span")
		}
	})

	t.Run("without tracing Processed carries no span context", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(recordEffect)
		processed := make(chan inboxrabbitmq.ProcessedMessage, 1)
		cfg.Hooks.Processed = func(e inboxrabbitmq.ProcessedMessage) { processed <- e }
		b.run(t, cfg)
		b.publish(t, jsonMessage("m-1"))
		require.False(t, (<-processed).SpanContext.IsValid())
	})

	t.Run("a delivery without trace headers starts a new trace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		b.run(t, tr.config(b, tr.workHandler))
		b.publish(t, jsonMessage("m-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool { return len(tr.named("process")) == 1 }, "traced")

		s := tr.named("process")[0]
		require.False(t, s.Parent().IsValid(), "a root span")
		require.Equal(t, inboxrabbitmq.OutcomeProcessed, spanAttrs(s)[inboxrabbitmq.AttrOutcome].AsString())
		require.Equal(t, 1, b.effects(t, "m-1"))
	})

	t.Run("retries and the dead letter stay in the producer's trace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		b.run(t, tr.config(b, func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			return errors.New("cannot apply")
		}))
		msg, producer := tr.tracedMessage("m-1")
		b.publish(t, msg)
		testinfra.Eventually(t, 30*time.Second, func() bool { return len(tr.named("process")) == 3 }, "three attempts traced")

		var outcomes []string
		for i, s := range tr.named("process") {
			a := spanAttrs(s)
			require.Equal(t, producer.TraceID(), s.SpanContext().TraceID())
			require.Equal(t, int64(i+1), a[inboxrabbitmq.AttrDeliveryCount].AsInt64())
			require.Equal(t, codes.Error, s.Status().Code)
			outcomes = append(outcomes, a[inboxrabbitmq.AttrOutcome].AsString())
		}
		require.Equal(t, []string{inboxrabbitmq.OutcomeRetried, inboxrabbitmq.OutcomeRetried, inboxrabbitmq.OutcomeDeadLettered}, outcomes)
		require.Equal(t, inboxrabbitmq.ReasonMaxDeliveries, spanAttrs(tr.named("process")[2])[inboxrabbitmq.AttrDeadReason].AsString())
	})
}

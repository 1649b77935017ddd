package inboxrabbitmq

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// The consumer's process span, one per delivery, a child of the trace context in its headers,
// which the handler's ctx carries: its instrumentation scope, and the attributes and event
// that the messaging semantic conventions do not define (docs/tracing.md lists them all;
// inbox.duplicate is set by [inbox.Process]).
const (
	TracerName = "github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"

	// AttrConsumer is the inbox consumer's name, [Config].Name.
	AttrConsumer = attribute.Key("inbox.consumer")
	// AttrOutcome is what became of the delivery, one of the Outcome constants.
	AttrOutcome = attribute.Key("inbox.outcome")
	// AttrDeliveryCount is the delivery's count, from 1 ([Delivery].DeliveryCount).
	AttrDeliveryCount = attribute.Key("inbox.delivery_count")
	// AttrMessageType is the message's type property.
	AttrMessageType = attribute.Key("inbox.message.type")
	// AttrDeadReason is the reason of a dead-lettered delivery, one of [Reasons].
	AttrDeadReason = attribute.Key("inbox.dead_reason")
	// EventHeld is the event of each transient failure that holds the delivery.
	EventHeld = "inbox.held"
)

// Outcomes of a delivery, the values of AttrOutcome: the paths of the package doc.
const (
	OutcomeProcessed    = "processed"
	OutcomeDuplicate    = "duplicate"
	OutcomeRetried      = "retried"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeHandedBack   = "handed_back"
)

// tableCarrier reads a delivery's headers for a propagator: string values only, as the
// outbox and other W3C producers write them.
type tableCarrier amqp.Table

func (t tableCarrier) Get(key string) string {
	s, _ := t[key].(string)
	return s
}

func (t tableCarrier) Set(key, value string) { t[key] = value }

func (t tableCarrier) Keys() []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	return keys
}

// startSpan starts m's process span, a child of the context its headers carry (the
// publisher's: with the outbox, the relay's publish span), so that the handler's work is
// part of the trace of what sent the message; a delivery without one starts a trace. The
// handler's ctx carries it (see withSpan).
func (c *Consumer) startSpan(ctx context.Context, m *message) {
	parent := c.cfg.Propagator.Extract(ctx, tableCarrier(m.d.Headers))
	m.bag = baggage.FromContext(parent)
	_, m.span = c.tracer.Start(parent, "process "+c.cfg.Queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(m.start))
	if !m.span.IsRecording() {
		return
	}
	exchange := m.del.Exchange // the first publish's, also on a retry copy
	if exchange == "" {
		exchange = "amq.default"
	}
	m.span.SetAttributes(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(exchange),
		semconv.MessagingDestinationSubscriptionName(c.cfg.Queue),
		semconv.MessagingRabbitMQDestinationRoutingKey(m.del.RoutingKey),
		semconv.MessagingMessageID(m.d.MessageId),
		semconv.MessagingMessageBodySize(len(m.d.Body)),
		semconv.MessagingRabbitMQMessageDeliveryTag(int(m.d.DeliveryTag)),
		AttrConsumer.String(c.cfg.Name),
		AttrMessageType.String(m.d.Type),
		AttrDeliveryCount.Int(m.del.DeliveryCount),
	)
}

// withSpan returns ctx carrying m's process span and the baggage of its headers: the
// handler's ctx, so that its own spans (and an outbox.Add in it) nest under the process
// span and pass the baggage on.
func withSpan(ctx context.Context, m *message) context.Context {
	if m.bag.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, m.bag)
	}
	if m.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, m.span)
}

// heldEvent records a transient failure that holds m.
func (m *message) heldEvent(err error, retryIn time.Duration) {
	if m.span == nil || !m.span.IsRecording() {
		return
	}
	m.span.AddEvent(EventHeld, trace.WithAttributes(
		semconv.ErrorTypeKey.String(inbox.Classify(err).String()),
		attribute.String("error.message", err.Error()),
		attribute.Int64("inbox.retry_in_ms", retryIn.Milliseconds()),
	))
}

// endSpan ends m's process span with its outcome; err is the failure behind an outcome
// other than processed or duplicate.
func (m *message) endSpan(outcome string, err error) {
	if m.span == nil {
		return
	}
	if m.span.IsRecording() {
		m.span.SetAttributes(AttrOutcome.String(outcome))
		if err != nil {
			m.span.SetAttributes(semconv.ErrorTypeKey.String(outcome))
			m.span.SetStatus(codes.Error, err.Error())
		}
	}
	m.span.End()
	m.span = nil
}

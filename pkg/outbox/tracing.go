package outbox

import (
	"context"
	"errors"
	"maps"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the relay's spans.
const TracerName = "github.com/outboxshop/outboxshop/pkg/outbox"

// Attributes of the relay's publish span that the messaging semantic conventions do not
// define (docs/tracing.md in the repository lists them all).
const (
	// AttrOutcome is what became of the message, one of the Outcome* constants.
	AttrOutcome = attribute.Key("outbox.outcome")
	// AttrCreatedAt is when the row was written, by the database's clock, RFC 3339.
	AttrCreatedAt = attribute.Key("outbox.created_at")
	// AttrWaitMS is how long the row waited before this relay claimed it, in milliseconds:
	// the span's start minus AttrCreatedAt (two clocks).
	AttrWaitMS = attribute.Key("outbox.wait_ms")
	// AttrAttempt counts this publish attempt of the row, from 1.
	AttrAttempt       = attribute.Key("outbox.attempt")
	AttrMessageType   = attribute.Key("outbox.message.type")
	AttrAggregateType = attribute.Key("outbox.aggregate.type")
	AttrAggregateID   = attribute.Key("outbox.aggregate.id")
	// AttrRoutingKey is the routing key for a broker other than RabbitMQ.
	AttrRoutingKey = attribute.Key("outbox.routing_key")
)

// What became of a message, the values of AttrOutcome.
const (
	OutcomePublished   = "published"
	OutcomeFailed      = "failed"      // an attempt counted, retried later
	OutcomeDead        = "dead"        // not retried
	OutcomeDeferred    = "deferred"    // refused by the broker, no attempt counted
	OutcomeUntouched   = "untouched"   // not sent, or the broker unavailable
	OutcomeUncommitted = "uncommitted" // the outcome's commit failed: published again later
)

// Names of the events of the publish span.
const (
	// EventSent: the batch was handed to the [Publisher].
	EventSent = "outbox.sent"
	// EventConfirmed: the broker confirmed the message.
	EventConfirmed = "outbox.confirmed"
)

// traceHeaders returns h with the trace context of ctx recorded through prop (nil: the
// global propagator): W3C traceparent and tracestate, and baggage, with the default
// propagators. A header the caller set is kept as it is; a caller's traceparent also keeps
// out the tracestate of ctx, which belongs to another trace. h itself is never changed: the
// headers are copied when something is added. When ctx carries neither a span context nor
// baggage, h is returned at once: that is the cost of Add without tracing.
func traceHeaders(ctx context.Context, prop propagation.TextMapPropagator, h map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return h
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	c := addCarrier{orig: h}
	prop.Inject(ctx, &c)
	if c.out == nil {
		return h
	}
	return c.out
}

// addCarrier writes a propagator's fields into a copy of orig, made on the first write,
// leaving out the fields orig has.
type addCarrier struct {
	orig, out map[string]string
}

func (c *addCarrier) Get(key string) string {
	if c.out != nil {
		return c.out[key]
	}
	return c.orig[key]
}

func (c *addCarrier) Set(key, value string) {
	if _, ok := c.orig[key]; ok {
		return
	}
	if _, ok := c.orig[HeaderTraceparent]; ok && key == HeaderTracestate {
		return
	}
	if c.out == nil {
		c.out = make(map[string]string, len(c.orig)+3)
		maps.Copy(c.out, c.orig)
	}
	c.out[key] = value
}

func (c *addCarrier) Keys() []string {
	return nil // only Inject uses this carrier
}

// headerCarrier reads and writes a message's headers for a propagator.
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string { return h[key] }
func (h headerCarrier) Set(key, value string) { h[key] = value }
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// batchSpans are the publish spans of one relay cycle, one per claimed message, in the order
// of the batch. A nil *batchSpans (no messages) does nothing.
type batchSpans struct {
	spans    []trace.Span
	outcomes []spanOutcome
	// headers are what the publisher sends: the message's headers with the trace context of
	// its publish span; nil where they are the row's own.
	headers []map[string]string
}

type spanOutcome struct {
	outcome string
	err     error
}

// startSpans starts a publish span for each message of a claimed batch, at claimedAt.
//
// Each span is a child of the context recorded in the row's headers when it was added (a
// message without one starts a trace of its own). The messaging semantic conventions say
// that a send span links to the message's creation context and that the context of a send
// span travels with the message when no creation ("create") span exists. Add creates no
// span (so that it costs nothing without tracing), so the publish span stands in for the
// message's creation: it is parented by the context captured at Add, so that the request
// that wrote the row and the publish of its message are one trace however long the row
// waited, and however many relays crashed and published it again (the row keeps the
// context; each publish is one more child); and its own context goes with the message, so
// that the consumer's process span nests under the publish that delivered it. A link to the
// same context would repeat the parent, so there is none.
func (r *Relay) startSpans(ctx context.Context, msgs []Message, claimedAt time.Time) *batchSpans {
	if len(msgs) == 0 {
		return nil
	}
	bs := &batchSpans{
		spans:    make([]trace.Span, len(msgs)),
		outcomes: make([]spanOutcome, len(msgs)),
		headers:  make([]map[string]string, len(msgs)),
	}
	var name, nameOf string // the last span name, and its exchange: batches rarely mix many
	for i, m := range msgs {
		if name == "" || m.Exchange != nameOf {
			name, nameOf = r.spanName(m), m.Exchange
		}
		parent := r.cfg.Propagator.Extract(ctx, headerCarrier(m.Headers))
		pctx, span := r.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(claimedAt))
		bs.spans[i] = span
		sc := span.SpanContext()
		if sc.IsValid() && !sc.Equal(trace.SpanContextFromContext(parent)) {
			h := make(map[string]string, len(m.Headers)+2)
			maps.Copy(h, m.Headers)
			delete(h, HeaderTracestate) // the parent's; the propagator writes the span's own
			r.cfg.Propagator.Inject(pctx, headerCarrier(h))
			bs.headers[i] = h
		}
		if span.IsRecording() {
			span.SetAttributes(r.spanAttributes(m, len(msgs), claimedAt)...)
		}
	}
	return bs
}

// spanName is "publish" and the destination, as the conventions name send spans.
func (r *Relay) spanName(m Message) string {
	return "publish " + r.destination(m)
}

// destination is the exchange, or for RabbitMQ's default exchange its conventional name.
func (r *Relay) destination(m Message) string {
	if m.Exchange == "" && r.cfg.MessagingSystem == "rabbitmq" {
		return "amq.default"
	}
	return m.Exchange
}

func (r *Relay) spanAttributes(m Message, batch int, claimedAt time.Time) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 14)
	if r.cfg.MessagingSystem != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(r.cfg.MessagingSystem))
	}
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(r.destination(m)),
		semconv.MessagingMessageID(m.ID.String()),
		semconv.MessagingBatchMessageCount(batch),
		semconv.MessagingMessageBodySize(len(m.Payload)),
		AttrMessageType.String(m.Type),
		AttrAggregateType.String(m.AggregateType),
		AttrAggregateID.String(m.AggregateID),
		AttrAttempt.Int(m.Attempts+1),
	)
	if r.cfg.MessagingSystem == "rabbitmq" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(m.RoutingKey))
	} else if m.RoutingKey != "" {
		attrs = append(attrs, AttrRoutingKey.String(m.RoutingKey))
	}
	if !m.CreatedAt.IsZero() {
		attrs = append(attrs,
			AttrCreatedAt.String(m.CreatedAt.UTC().Format(time.RFC3339Nano)),
			AttrWaitMS.Float64(float64(claimedAt.Sub(m.CreatedAt))/float64(time.Millisecond)))
	}
	return attrs
}

// sendHeaders returns the headers to send for message i.
func (bs *batchSpans) sendHeaders(i int, m Message) map[string]string {
	if bs == nil || bs.headers[i] == nil {
		return m.Headers
	}
	return bs.headers[i]
}

// appendSampled appends the context of message i's publish span to scs, the span contexts
// of the n-1 messages published before it, when that span is sampled or scs is already
// kept; scs stays nil (nothing allocated) while no span is sampled.
func (bs *batchSpans) appendSampled(scs []trace.SpanContext, i, n int) []trace.SpanContext {
	if bs == nil {
		return scs
	}
	sc := bs.spans[i].SpanContext()
	if !sc.IsSampled() {
		if scs == nil {
			return nil
		}
		return append(scs, trace.SpanContext{})
	}
	if scs == nil {
		scs = make([]trace.SpanContext, n-1, len(bs.spans))
	}
	return append(scs, sc)
}

// sent marks the moment the batch went to the publisher.
func (bs *batchSpans) sent(at time.Time) {
	if bs == nil {
		return
	}
	for _, s := range bs.spans {
		if s.IsRecording() {
			s.AddEvent(EventSent, trace.WithTimestamp(at))
		}
	}
}

// outcome records what became of message i; err is the publisher's answer.
func (bs *batchSpans) outcome(i int, outcome string, err error) {
	if bs == nil {
		return
	}
	bs.outcomes[i] = spanOutcome{outcome: outcome, err: err}
}

// end ends every span: confirmedAt is when the broker's answers came, cycleErr what ended
// the cycle before its commit, if anything did.
func (bs *batchSpans) end(confirmedAt time.Time, cycleErr error) {
	if bs == nil {
		return
	}
	for i, s := range bs.spans {
		if !s.IsRecording() {
			s.End()
			continue
		}
		o := bs.outcomes[i]
		if o.outcome == OutcomePublished && !confirmedAt.IsZero() {
			s.AddEvent(EventConfirmed, trace.WithTimestamp(confirmedAt))
		}
		switch {
		case cycleErr != nil && !errors.As(cycleErr, new(brokerError)):
			// The outcome was not committed: the row is pending again, and a message the
			// broker had is published a second time.
			if o.outcome == "" || o.outcome == OutcomePublished {
				o.outcome = OutcomeUncommitted
			}
			s.SetAttributes(semconv.ErrorTypeKey.String(OutcomeUncommitted))
			s.SetStatus(codes.Error, cycleErr.Error())
		case o.err != nil:
			s.SetAttributes(semconv.ErrorTypeKey.String(failureClass(o.err)))
			s.SetStatus(codes.Error, o.err.Error())
		}
		if o.outcome != "" {
			s.SetAttributes(AttrOutcome.String(o.outcome))
		}
		s.End()
	}
}

// failureClass names the class of a publish failure, for the span's error.type.
func failureClass(err error) string {
	switch {
	case IsPermanent(err):
		if errors.Is(err, ErrTooLarge) {
			return "too_large"
		}
		return "permanent"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrNotSent):
		return "not_sent"
	case errors.Is(err, ErrRefused):
		return "refused"
	case errors.Is(err, ErrUnroutable):
		return "unroutable"
	}
	return "failed"
}

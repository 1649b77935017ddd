package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"mime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

// maxReasonLen bounds the dead-reason header; error texts can be long.
const maxReasonLen = 4096

// headerDeliveryCount is the header in which a quorum queue tells how often it delivered a
// message before. The consumer strips it from the copies it publishes to the queue, which
// the broker counts from zero.
const headerDeliveryCount = "x-delivery-count"

// message is one delivery on its way through the consumer.
type message struct {
	d   amqp.Delivery
	del Delivery
	log *slog.Logger
	// arrived is when the delivery reached the consumer (its consumer_timeout clock runs
	// from there); start is when a worker took it.
	arrived, start time.Time
	// retries is the retry count a copy of this message carries back to the queue:
	// DeliveryCount-1, or DeliveryCount once this attempt failed and counts.
	retries int
	// held is set while the delivery is held after transient failures, since holdStart;
	// failures counts them.
	held      bool
	holdStart time.Time
	failures  int
	// span is the delivery's process span, ended with its outcome, and bag the baggage of
	// its headers; cause is the failure behind a retry.
	span  trace.Span
	bag   baggage.Baggage
	cause error
}

// step is one stage of a delivery's handling. It returns the stage to run next (nil when the
// delivery is settled) and nil, or, when it failed transiently, the stage to retry in place
// and the error. An error wrapping errInterrupted means the session ended under it.
type step func() (next step, err error)

// errInterrupted marks a stage cut short because the consumer is stopping or lost its
// connection.
var errInterrupted = errors.New("interrupted: the consumer is stopping or lost its broker connection")

// handle takes one delivery to its end: acknowledged after commit or as a duplicate, retried,
// dead-lettered, or handed back to the broker. It never drops a message: every path that
// does not end in a confirmed republish and an ack ends in a Nack with requeue, or leaves the
// message unacknowledged for the broker to redeliver.
//
// A stage that fails transiently (the database unreachable, a deadlock, a failed publish) is
// retried in place with backoff (holdDelay) while the delivery stays unacknowledged, which the
// broker does not count as a delivery. The hold ends when the stage succeeds, when MaxHold
// since the delivery's arrival would be exceeded, or when the session ends; then the delivery
// is handed back (see handBack).
//
// A hold is logged by the consumer's hold streak (c.holds), not per delivery: a warning when
// the first delivery is held, with the error; at most one more per log interval while
// deliveries are held, with how many attempts failed; one line once a delivery is settled
// and none is held any more. A delivery's own lines (held, retried in place, processed after
// the hold, handed back at MaxHold) are at debug level. During an outage every prefetched
// delivery is held for the same cause: a warning per delivery would say Prefetch times what
// the streak says once, and again after each MaxHold, as every hand-back's copy arrives and
// starts a hold of its own.
func (c *Consumer) handle(s *session, in inbound) {
	m := &message{d: in.Delivery, del: newDelivery(in.Delivery), arrived: in.at, start: time.Now()}
	m.retries = m.del.DeliveryCount - 1
	m.log = c.log.With(
		slog.String("message_id", m.d.MessageId),
		slog.String("message_type", m.d.Type),
		slog.Int("delivery_count", m.del.DeliveryCount),
	)
	defer c.endHold(m)
	c.startSpan(s.workCtx, m)
	defer m.endSpan(OutcomeHandedBack, errInterrupted) // every path ends it before; a safety net

	next := c.check(s, m)
	for next != nil {
		stage := next
		var err error
		next, err = stage()
		if err == nil {
			continue
		}
		if errors.Is(err, errInterrupted) || s.stopped() {
			c.handBack(s, m, err)
			return
		}
		if next == nil {
			next = stage
		}
		m.failures++
		delay := c.holdDelay(m.failures)
		m.heldEvent(err, delay)
		if c.holdFailed(s.workCtx, m, err) {
			if h := c.cfg.Hooks.Held; h != nil {
				h(Hold{Consumer: c.cfg.Name, Type: m.d.Type, Held: true})
			}
			m.log.DebugContext(s.workCtx, "transient failure; holding the message and retrying in place",
				slog.Any("error", err), slog.Duration("retry_in", delay), slog.Duration("max_hold", c.cfg.MaxHold))
		} else {
			m.log.DebugContext(s.workCtx, "transient failure; still holding the message",
				slog.Any("error", err), slog.Int("failures", m.failures), slog.Duration("retry_in", delay))
		}
		if time.Since(m.arrived)+delay > c.cfg.MaxHold {
			c.handBack(s, m, err)
			return
		}
		if !retry.Sleep(s.waitCtx, delay) {
			c.handBack(s, m, errInterrupted)
			return
		}
	}
	c.endHold(m)
	c.settled(s.workCtx)
}

// holdFailed records a transient failure of m in the consumer's hold streak, which logs it
// as the streak's lines say, and starts m's hold unless it is held already; it reports
// whether it started it. The streak's wait is not used: each held delivery backs off on its
// own (holdDelay), and at most Concurrency of them are held at once.
func (c *Consumer) holdFailed(ctx context.Context, m *message, err error) (started bool) {
	c.holdsMu.Lock()
	defer c.holdsMu.Unlock()
	c.holds.Fail(ctx, err)
	if m.held {
		return false
	}
	m.held, m.holdStart = true, time.Now()
	c.held.Add(1)
	return true
}

// settled records that a delivery was settled (processed, retried or dead-lettered): when no
// delivery is held any more, the hold streak, if there was one, is over. A hold that ends in
// a hand-back does not end the streak: its copy comes back, and is held again while the
// cause lasts.
func (c *Consumer) settled(ctx context.Context) {
	c.holdsMu.Lock()
	defer c.holdsMu.Unlock()
	if c.held.Load() == 0 {
		c.holds.Succeed(ctx)
	}
}

// holdBackoff spaces the retries in place of a held delivery: the retry backoff, at most a
// quarter of MaxHold (and starting at most at an eighth), so that a hold retries several
// times before its delivery is handed back, and a hand-back never follows its arrival at
// once.
func (c *Consumer) holdBackoff() retry.Backoff {
	limit := min(c.cfg.MaxRetryDelay, c.cfg.MaxHold/4)
	return retry.Backoff{Base: min(c.cfg.RetryDelay, c.cfg.MaxHold/8, limit), Max: limit}
}

// holdDelay is the wait before the n-th retry in place of a held delivery (n counts from 1).
func (c *Consumer) holdDelay(n int) time.Duration { return c.holdBackoff().Delay(n) }

// endHold ends m's hold, if it was held.
func (c *Consumer) endHold(m *message) {
	if !m.held {
		return
	}
	m.held = false
	c.held.Add(-1)
	if h := c.cfg.Hooks.Held; h != nil {
		h(Hold{Consumer: c.cfg.Name, Type: m.d.Type, Held: false})
	}
}

// check returns the first stage for m: dead-lettering when the message can never succeed,
// processing otherwise.
func (c *Consumer) check(s *session, m *message) step {
	if reason, detail := refusal(c.cfg, m.del); reason != "" {
		return c.deadLetterStage(s, m, reason, detail)
	}
	return c.processStage(s, m)
}

// Refusal returns why the consumer built from c dead-letters d before its handler runs (one
// of the Reason* constants, with details), or "" when it would run the handler on d. It
// applies the same defaults as [NewConsumer] (MaxBodyBytes) and needs nothing else of c:
// rabbitmqtest uses it to reach the consumer's outcome without a broker.
func (c Config) Refusal(d Delivery) (reason, detail string) {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	contentTypes := make([]string, 0, len(c.ContentTypes))
	for _, ct := range c.ContentTypes {
		contentTypes = append(contentTypes, mediaType(ct))
	}
	c.ContentTypes = contentTypes
	return refusal(c, d)
}

// refusal is [Config.Refusal] for a cfg with its defaults. The checks run in the order of
// [Reasons]; the body is parsed only when it is small enough.
func refusal(cfg Config, d Delivery) (reason, detail string) {
	if d.ID == "" {
		return ReasonMissingMessageID, "the message has no message-id property, so the inbox cannot deduplicate it"
	}
	if err := (inbox.Message{ID: d.ID, Type: d.Type}).Validate(); err != nil {
		if errors.Is(err, inbox.ErrInvalidMessageType) {
			return ReasonInvalidMessageType, err.Error()
		}
		return ReasonInvalidMessageID, err.Error()
	}
	if len(d.Body) > cfg.MaxBodyBytes {
		return ReasonBodyTooLarge, fmt.Sprintf("the body has %d bytes, more than the %d accepted", len(d.Body), cfg.MaxBodyBytes)
	}
	mt := mediaType(d.ContentType)
	if len(cfg.ContentTypes) > 0 && !slices.Contains(cfg.ContentTypes, mt) {
		return ReasonUnsupportedContentType, fmt.Sprintf("content type %q is not one of %q", d.ContentType, cfg.ContentTypes)
	}
	jsonBody := isJSON(mt)
	if jsonBody {
		if cs := charset(d.ContentType); cs != "" && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			return ReasonUnsupportedContentType, fmt.Sprintf("content type %q: JSON must be UTF-8", d.ContentType)
		}
	}
	if len(cfg.Types) > 0 && !slices.Contains(cfg.Types, d.Type) {
		return ReasonUnknownType, fmt.Sprintf("type %q is not one of %q", d.Type, cfg.Types)
	}
	if jsonBody {
		if err := checkJSON(d.Body); err != nil {
			return ReasonMalformedJSON, err.Error()
		}
	}
	return "", ""
}

// processStage runs the inbox transaction: the inbox row, the handler's writes and the
// commit. The first attempt runs on workCtx, which outlives a stop by ShutdownTimeout; the
// retries of a held delivery run on waitCtx, so that a stop ends them at once.
func (c *Consumer) processStage(s *session, m *message) step {
	var self step
	self = func() (step, error) {
		ctx := s.workCtx
		if m.held {
			ctx = s.waitCtx
		}
		ctx = withSpan(ctx, m) // the handler's spans nest under the process span
		var handlerErr error
		msg := inbox.Message{ID: m.d.MessageId, Type: m.d.Type, ReceivedAt: m.start}
		duplicate, err := c.store.Process(ctx, c.pool, c.cfg.Name, msg, func(ctx context.Context, tx pgx.Tx) error {
			if err := c.callHandler(ctx, tx, m.del, m.log); err != nil {
				handlerErr = err
				return err
			}
			c.failpoint(FailpointBeforeCommit)
			return nil
		})
		if err == nil {
			c.processed(s, m, duplicate)
			return nil, nil
		}
		if h := c.cfg.Hooks.HandlerError; h != nil {
			h(HandlerFailure{Consumer: c.cfg.Name, Type: m.d.Type, Err: err})
		}
		if ctx.Err() != nil {
			// A stop or a lost connection cut the attempt short; it rolled back. Not the
			// message's fault.
			return self, fmt.Errorf("%w: %w", errInterrupted, err)
		}
		// After a failed commit the effect may have happened; the next attempt finds out
		// through the inbox.
		cause := err
		if handlerErr != nil {
			cause = handlerErr
		}
		class := inbox.Classify(err)
		switch {
		case class == inbox.ClassTransient:
			return self, err
		case class == inbox.ClassPermanent:
			return c.deadLetterStage(s, m, ReasonPermanent, cause.Error()), nil
		case m.del.DeliveryCount >= c.cfg.MaxDeliveries:
			return c.deadLetterStage(s, m, ReasonMaxDeliveries,
				fmt.Sprintf("failed on all %d attempts; last error: %v", m.del.DeliveryCount, cause)), nil
		default:
			m.retries = m.del.DeliveryCount
			return c.retryStage(s, m, cause), nil
		}
	}
	return self
}

// processed acknowledges a committed or duplicate message.
func (c *Consumer) processed(s *session, m *message, duplicate bool) {
	if !duplicate {
		c.failpoint(FailpointAfterCommit)
	}
	// Acknowledge only now that the effect is committed (or was, by an earlier delivery).
	if err := m.d.Ack(false); err != nil {
		m.log.WarnContext(s.workCtx, "ack after commit failed; the broker will redeliver the message and the inbox will skip it",
			slog.Any("error", err))
	}
	var sc trace.SpanContext
	if m.span != nil {
		sc = m.span.SpanContext()
	}
	if duplicate {
		m.endSpan(OutcomeDuplicate, nil)
	} else {
		m.endSpan(OutcomeProcessed, nil)
	}
	if h := c.cfg.Hooks.Processed; h != nil {
		h(ProcessedMessage{Consumer: c.cfg.Name, Type: m.d.Type, Duplicate: duplicate, Duration: time.Since(m.start), SpanContext: sc})
	}
	switch {
	case m.held: // the hold streak says it for every held delivery at once (see handle)
		m.log.DebugContext(s.workCtx, "message processed after transient failures", slog.Bool("duplicate", duplicate),
			slog.Int("failures", m.failures), slog.Duration("held_for", time.Since(m.holdStart).Round(time.Millisecond)))
	case duplicate:
		m.log.InfoContext(s.workCtx, "duplicate message skipped", slog.Bool("redelivered", m.d.Redelivered))
	default:
		m.log.DebugContext(s.workCtx, "message processed", slog.Duration("took", time.Since(m.start)))
	}
}

// callHandler runs the handler and turns a panic into an error, so a bug in one message's
// handling neither kills the process nor skips the retry and dead-letter path.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, d Delivery, log *slog.Logger) (err error) {
	defer func() {
		if r := recover(); r != nil {
			log.ErrorContext(ctx, "handler panicked", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			if e, ok := r.(error); ok {
				err = fmt.Errorf("handler panicked: %w", e)
			} else {
				err = fmt.Errorf("handler panicked: %v", r)
			}
		}
	}()
	return c.cfg.Handler(ctx, tx, d)
}

func (c *Consumer) failpoint(name string) {
	if f := c.cfg.Hooks.Failpoint; f != nil {
		f(FailpointHit{Name: name})
	}
}

// retryStage waits the backoff of a counted failure, then publishes the retry copy.
func (c *Consumer) retryStage(s *session, m *message, cause error) step {
	return func() (step, error) {
		// One wait per counted attempt, at most MaxDeliveries per message: RetryDelay
		// doubling to MaxRetryDelay, jittered.
		delay := retry.Backoff{Base: c.cfg.RetryDelay, Max: c.cfg.MaxRetryDelay}.Delay(m.del.DeliveryCount)
		m.log.WarnContext(s.workCtx, "handler failed; retrying",
			slog.Any("error", cause), slog.Duration("retry_in", delay), slog.Int("max_deliveries", c.cfg.MaxDeliveries))
		if !retry.Sleep(s.waitCtx, delay) {
			return nil, errInterrupted
		}
		m.cause = cause
		return c.publishRetryStage(s, m), nil
	}
}

// publishRetryStage republishes a copy of the message with its retry count increased to the
// tail of the queue, and then acknowledges the original.
func (c *Consumer) publishRetryStage(s *session, m *message) step {
	var self step
	self = func() (step, error) {
		copied := c.copyOf(m.d, m.del, s.user)
		forQueue(&copied, m.del.DeliveryCount)
		// The copy is confirmed before the original is acknowledged, so the message exists
		// in the broker at every moment. If the process dies in between, the broker
		// redelivers the original as well: both carry the same message id, so whichever is
		// processed second is absorbed by the inbox as a duplicate.
		if err := s.pub.publish(s.workCtx, "", c.cfg.Queue, copied); err != nil {
			return self, fmt.Errorf("publish the retry copy: %w", err)
		}
		if err := m.d.Ack(false); err != nil {
			m.log.WarnContext(s.workCtx, "ack of the retried original failed; the inbox absorbs its redelivery if the copy succeeds first",
				slog.Any("error", err))
		}
		m.endSpan(OutcomeRetried, m.cause)
		if h := c.cfg.Hooks.Retried; h != nil {
			h(Retry{Consumer: c.cfg.Name, Type: m.d.Type, DeliveryCount: m.del.DeliveryCount})
		}
		return nil, nil
	}
	return self
}

// deadLetterStage publishes a copy of the message to the dead-letter destination with the
// reason, and acknowledges the original only after the broker confirmed the copy. When the
// publish fails the message is held and the publish retried: a message is never lost.
func (c *Consumer) deadLetterStage(s *session, m *message, reason, detail string) step {
	text := reason + ": " + detail
	if len(text) > maxReasonLen {
		text = strings.ToValidUTF8(text[:maxReasonLen], "")
	}
	var self step
	self = func() (step, error) {
		copied := c.copyOf(m.d, m.del, s.user)
		copied.Headers[HeaderDeadReason] = text
		copied.Headers[HeaderOriginalQueue] = c.cfg.Queue
		// A dead letter must outlive a broker restart and must not expire before someone
		// looks.
		copied.DeliveryMode = amqp.Persistent
		if copied.Expiration != "" {
			copied.Headers[HeaderOriginalExpiration] = copied.Expiration
			copied.Expiration = ""
		}
		if err := s.pub.publish(s.workCtx, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, copied); err != nil {
			return self, fmt.Errorf("dead-lettering failed (%s): %w", text, err)
		}
		if err := m.d.Ack(false); err != nil {
			m.log.WarnContext(s.workCtx, "ack after dead-lettering failed; the message will be redelivered and dead-lettered again",
				slog.Any("error", err))
		}
		if m.span != nil && m.span.IsRecording() {
			m.span.SetAttributes(AttrDeadReason.String(reason))
		}
		m.endSpan(OutcomeDeadLettered, errors.New(text))
		if h := c.cfg.Hooks.DeadLettered; h != nil {
			h(DeadLetter{Consumer: c.cfg.Name, Type: m.d.Type, Reason: reason})
		}
		m.log.WarnContext(s.workCtx, "message dead-lettered", slog.String("reason", text),
			slog.String("dead_letter_exchange", c.cfg.DeadLetterExchange), slog.String("dead_letter_routing_key", c.cfg.DeadLetterRoutingKey))
		return nil, nil
	}
	return self
}

// handBack returns a delivery that the consumer cannot finish now to the broker, unprocessed.
//
// It republishes a copy to the tail of the queue through the default exchange (same message
// id, body, properties and retry count; the quorum queue's x-delivery-count removed), waits
// for the broker's confirm and then acknowledges the original. The broker counts no delivery
// for that: a quorum queue's x-delivery-limit counts rejects and closed channels, and the
// copy starts at zero. When the consumer is stopping, the copy is published after the
// subscription ended, so that it goes to another consumer or waits for the next start.
//
// When that cannot be done (the connection is gone, the shutdown timeout passed, the publish
// failed), the original is rejected with requeue, or left to the broker if its channel is
// closed; then the broker counts a delivery. A message is never dropped: until the ack,
// both the original and the copy may exist, and the inbox absorbs whichever is second.
func (c *Consumer) handBack(s *session, m *message, cause error) {
	reason := HandBackHoldLimit
	stopping := s.stopRequested()
	if stopping {
		reason = HandBackShutdown
		select {
		case <-s.cancelled:
		case <-s.workCtx.Done():
		}
	}
	// After a lost connection (the session ended without a stop) nothing can be published.
	err := errInterrupted
	if s.workCtx.Err() == nil && (stopping || !s.stopped()) {
		copied := c.copyOf(m.d, m.del, s.user)
		forQueue(&copied, m.retries)
		if err = s.pub.publish(s.workCtx, "", c.cfg.Queue, copied); err == nil {
			if err := m.d.Ack(false); err != nil {
				m.log.WarnContext(s.workCtx, "ack of a handed-back message failed; the inbox absorbs the second of the two copies",
					slog.Any("error", err))
			}
			c.hookHandedBack(m.d.Type, reason)
			m.endSpan(OutcomeHandedBack, cause)
			// At MaxHold a routine part of a hold, which the hold streak reports (see
			// handle); on a stop, once per held delivery.
			level := slog.LevelDebug
			if stopping {
				level = slog.LevelInfo
			}
			m.log.Log(s.workCtx, level, "message handed back to the queue without counting a delivery",
				slog.String("reason", reason), slog.Any("error", cause), slog.Int("failures", m.failures),
				slog.Duration("since_arrival", time.Since(m.arrived).Round(time.Millisecond)))
			return
		}
	}
	if nackErr := m.d.Nack(false, true); nackErr != nil {
		m.log.DebugContext(s.workCtx, "nack failed; the broker redelivers the message once the channel is gone", slog.Any("error", nackErr))
	}
	c.hookHandedBack(m.d.Type, HandBackRequeued)
	m.endSpan(OutcomeHandedBack, cause)
	// A warning per delivery: each costs a delivery count. At most Prefetch of them per stop
	// or lost connection, and a new connection comes only after the reconnect backoff.
	m.log.WarnContext(s.workCtx, "message goes back to the queue; the broker counts a delivery",
		slog.Any("error", cause), slog.Any("hand_back_error", err))
}

// forQueue prepares a copy for the consumer's own queue: it carries retries as its retry
// count, and none of the dead-letter or broker headers of its original.
func forQueue(p *amqp.Publishing, retries int) {
	delete(p.Headers, HeaderDeadReason) // a replayed dead letter starts over; its copies do not
	delete(p.Headers, HeaderOriginalQueue)
	delete(p.Headers, headerDeliveryCount)
	if retries > 0 {
		p.Headers[HeaderRetries] = int32(retries)
	} else {
		delete(p.Headers, HeaderRetries)
	}
}

// copyOf returns a publishing with the delivery's body and properties, and its headers plus
// the original exchange and routing key. user is the connection's login: a user-id property
// naming anyone else moves to HeaderOriginalUserID.
func (c *Consumer) copyOf(d amqp.Delivery, del Delivery, user string) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+6)
	maps.Copy(headers, d.Headers)
	headers[HeaderOriginalExchange] = del.Exchange
	headers[HeaderOriginalRoutingKey] = del.RoutingKey
	userID := d.UserId
	if userID != "" && userID != user {
		headers[HeaderOriginalUserID] = userID
		userID = ""
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          userID,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// newDelivery is the handler's view of d: the original exchange and routing key also on a
// retry copy, and the attempt number.
func newDelivery(d amqp.Delivery) Delivery {
	exchange, routingKey := d.Exchange, d.RoutingKey
	if rk, ok := d.Headers[HeaderOriginalRoutingKey].(string); ok {
		routingKey = rk
		if ex, ok := d.Headers[HeaderOriginalExchange].(string); ok {
			exchange = ex
		}
	}
	retries := headerInt(d.Headers[HeaderRetries])
	if _, replayed := d.Headers[HeaderDeadReason]; replayed {
		retries = 0 // a dead letter put back into the queue gets a fresh set of attempts
	}
	return Delivery{
		ID:            d.MessageId,
		Type:          d.Type,
		Exchange:      exchange,
		RoutingKey:    routingKey,
		Headers:       maps.Clone(d.Headers), // the handler may change its copy
		ContentType:   d.ContentType,
		CorrelationID: d.CorrelationId,
		Timestamp:     d.Timestamp,
		Body:          d.Body,
		Redelivered:   d.Redelivered,
		DeliveryCount: retries + 1,
	}
}

// headerInt reads a non-negative count from a header value of any AMQP integer type (or a
// decimal string); anything else counts as 0.
func headerInt(v any) int {
	var n int64
	switch v := v.(type) {
	case int:
		n = int64(v)
	case int8:
		n = int64(v)
	case int16:
		n = int64(v)
	case int32:
		n = int64(v)
	case int64:
		n = v
	case uint8:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint32:
		n = int64(v)
	case string:
		n, _ = strconv.ParseInt(v, 10, 64)
	}
	return int(max(0, min(n, 1<<20)))
}

// isJSON reports whether a body of this content type must be JSON: application/json, any
// +json type, or no content type at all.
func isJSON(contentType string) bool {
	mt := mediaType(contentType)
	return mt == "" || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// mediaType returns the media type of a content type, lower case and without parameters;
// "" for an empty one.
func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt
}

// charset returns the charset parameter of a content type, or "".
func charset(contentType string) string {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return ""
	}
	return params["charset"]
}

// checkJSON returns why body is not valid JSON, or nil. JSON exchanged between systems is
// UTF-8 (RFC 8259): encoding/json would silently turn invalid bytes inside strings into
// U+FFFD, so they are refused here.
func checkJSON(body []byte) error {
	if json.Valid(body) {
		if !utf8.Valid(body) {
			return errors.New("body is not valid UTF-8")
		}
		return nil
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	if err == nil {
		err = errors.New("invalid JSON")
	}
	return fmt.Errorf("body is not valid JSON: %w", err)
}

package inboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/internal/decide"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

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
	m := c.newMessage(s, in)
	c.run(s, m, c.check(s, m))
}

// newMessage starts the handling of a delivery: its handler's view, its logger and its
// process span.
func (c *Consumer) newMessage(s *session, in inbound) *message {
	m := &message{d: in.Delivery, del: newDelivery(in.Delivery), arrived: in.at, start: time.Now()}
	m.retries = m.del.DeliveryCount - 1
	m.log = c.log.With(
		slog.String("message_id", m.d.MessageId),
		slog.String("message_type", m.d.Type),
		slog.Int("delivery_count", m.del.DeliveryCount),
	)
	c.startSpan(s.workCtx, m)
	return m
}

// run takes m through its stages from next to the end, as handle says.
func (c *Consumer) run(s *session, m *message, next step) {
	defer c.endHold(m)
	defer m.endSpan(OutcomeHandedBack, errInterrupted) // every path ends it before; a safety net
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
		delay := c.hold(s, m, err)
		if outlastsHold(time.Since(m.arrived), delay, c.cfg.MaxHold) {
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

// hold records a transient failure of m's current stage: it starts m's hold, or counts one
// more failure of it, and returns the wait before the stage's next attempt.
func (c *Consumer) hold(s *session, m *message, err error) (delay time.Duration) {
	m.failures++
	delay = c.holdDelay(m.failures)
	m.heldEvent(err, delay)
	if c.holdFailed(s.workCtx, m, err) {
		c.hookHeld(m.d.Type, true)
		m.log.DebugContext(s.workCtx, "transient failure; holding the message and retrying in place",
			slog.Any("error", err), slog.Duration("retry_in", delay), slog.Duration("max_hold", c.cfg.MaxHold))
	} else {
		m.log.DebugContext(s.workCtx, "transient failure; still holding the message",
			slog.Any("error", err), slog.Int("failures", m.failures), slog.Duration("retry_in", delay))
	}
	return delay
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

// endHold ends m's hold, if it was held.
func (c *Consumer) endHold(m *message) {
	if !m.held {
		return
	}
	m.held = false
	c.held.Add(-1)
	c.hookHeld(m.d.Type, false)
}

// check returns the first stage for m: dead-lettering when the message can never succeed,
// processing otherwise.
func (c *Consumer) check(s *session, m *message) step {
	if reason, detail := refusal(c.cfg, m.del); reason != "" {
		return c.deadLetterStage(s, m, reason, detail)
	}
	return c.processStage(s, m)
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
		return c.afterFailure(ctx, s, m, err, handlerErr)
	}
	return self
}

// afterFailure decides what follows a failed attempt to process m on ctx, which failed with
// err (handlerErr when the handler's error caused it): the stage to run next, and an error
// when that is to retry processing after a transient failure or an interruption.
func (c *Consumer) afterFailure(ctx context.Context, s *session, m *message, err, handlerErr error) (step, error) {
	if h := c.cfg.Hooks.HandlerError; h != nil {
		h(HandlerFailure{Consumer: c.cfg.Name, Type: m.d.Type, Err: err})
	}
	// After a failed commit the effect may have happened; the next attempt finds out
	// through the inbox.
	cause := err
	if handlerErr != nil {
		cause = handlerErr
	}
	switch then, r := decide.AfterFailure(ctx.Err() != nil, inbox.Classify(err), m.del.DeliveryCount, c.cfg.MaxDeliveries); then {
	case decide.Interrupted:
		return c.processStage(s, m), fmt.Errorf("%w: %w", errInterrupted, err)
	case decide.Hold:
		return c.processStage(s, m), err
	case decide.DeadLetter:
		reason, detail := reasons[r], cause.Error()
		if reason == ReasonMaxDeliveries {
			detail = fmt.Sprintf("failed on all %d attempts; last error: %v", m.del.DeliveryCount, cause)
		}
		return c.deadLetterStage(s, m, reason, detail), nil
	default:
		m.retries = m.del.DeliveryCount
		return c.retryStage(s, m, cause), nil
	}
}

// processed acknowledges a committed or duplicate message.
func (c *Consumer) processed(s *session, m *message, duplicate bool) {
	if !duplicate {
		c.failpoint(FailpointAfterCommit)
	}
	// Acknowledge only now that the effect is committed (or was, by an earlier delivery).
	s.acks.ack(m.d.DeliveryTag)
	c.finishProcessed(s, m, duplicate)
}

// finishProcessed ends the handling of a processed message that is acknowledged: its span,
// its hook and its log line.
func (c *Consumer) finishProcessed(s *session, m *message, duplicate bool) {
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
			err = decide.PanicError(r)
		}
	}()
	return c.cfg.Handler(ctx, tx, d)
}

// retryStage waits the backoff of a counted failure, then publishes the retry copy.
func (c *Consumer) retryStage(s *session, m *message, cause error) step {
	return func() (step, error) {
		delay := c.retryDelay(m.del.DeliveryCount)
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
		copied := copyOf(m.d, m.del, s.user)
		forQueue(&copied, m.del.DeliveryCount)
		// The copy is confirmed before the original is acknowledged, so the message exists
		// in the broker at every moment. If the process dies in between, the broker
		// redelivers the original as well: both carry the same message id, so whichever is
		// processed second is absorbed by the inbox as a duplicate.
		if err := s.pub.publish(s.workCtx, "", c.cfg.Queue, copied); err != nil {
			return self, fmt.Errorf("publish the retry copy: %w", err)
		}
		if err := s.acks.ackNow(m.d.DeliveryTag); err != nil {
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
	text := deadReasonText(reason, detail)
	var self step
	self = func() (step, error) {
		copied := copyOf(m.d, m.del, s.user)
		asDeadLetter(&copied, text, c.cfg.Queue)
		if err := s.pub.publish(s.workCtx, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, copied); err != nil {
			return self, fmt.Errorf("dead-lettering failed (%s): %w", text, err)
		}
		if err := s.acks.ackNow(m.d.DeliveryTag); err != nil {
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
	stopping := s.stopRequested()
	if stopping {
		select {
		case <-s.cancelled:
		case <-s.workCtx.Done():
		}
	}
	// An uncounted copy, unless the connection is lost (nothing can be published on it) or
	// the shutdown timed out.
	err := errInterrupted
	if reason := handBackWay(stopping, s.stopped(), s.workCtx.Err() != nil); reason != HandBackRequeued {
		copied := copyOf(m.d, m.del, s.user)
		forQueue(&copied, m.retries)
		if err = s.pub.publish(s.workCtx, "", c.cfg.Queue, copied); err == nil {
			if err := s.acks.ackNow(m.d.DeliveryTag); err != nil {
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
	if nackErr := s.acks.nack(m.d.DeliveryTag); nackErr != nil {
		m.log.DebugContext(s.workCtx, "nack failed; the broker redelivers the message once the channel is gone", slog.Any("error", nackErr))
	}
	c.hookHandedBack(m.d.Type, HandBackRequeued)
	m.endSpan(OutcomeHandedBack, cause)
	// A warning per delivery: each costs a delivery count. At most Prefetch of them per stop
	// or lost connection, and a new connection comes only after the reconnect backoff.
	m.log.WarnContext(s.workCtx, "message goes back to the queue; the broker counts a delivery",
		slog.Any("error", cause), slog.Any("hand_back_error", err))
}

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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// maxReasonLen bounds the dead-reason header; error texts can be long.
const maxReasonLen = 4096

// handle takes one delivery to its end: acknowledged after commit or as a duplicate, retried,
// dead-lettered, or handed back to the broker. It never drops a message: every path that
// does not end in a confirmed republish and an ack ends in a Nack with requeue, or leaves the
// message unacknowledged for the broker to redeliver.
func (c *Consumer) handle(s *session, d amqp.Delivery) {
	start := time.Now()
	del := newDelivery(d)
	ctx := s.workCtx
	log := c.log.With(
		slog.String("message_id", d.MessageId),
		slog.String("message_type", d.Type),
		slog.Int("delivery_count", del.DeliveryCount),
	)

	// Messages that can never succeed go to the dead-letter destination at once.
	if d.MessageId == "" {
		c.deadLetter(s, d, del, log, ReasonMissingMessageID, "the message has no message-id property, so the inbox cannot deduplicate it")
		return
	}
	if isJSON(d.ContentType) {
		if err := checkJSON(d.Body); err != nil {
			c.deadLetter(s, d, del, log, ReasonMalformedJSON, err.Error())
			return
		}
	}

	// The inbox row, the handler's writes and the commit are one transaction.
	var handlerErr error
	msg := inbox.Message{ID: d.MessageId, Type: d.Type, ReceivedAt: start}
	duplicate, err := inbox.Process(ctx, c.pool, c.cfg.Name, msg, func(ctx context.Context, tx pgx.Tx) error {
		if err := c.callHandler(ctx, tx, del, log); err != nil {
			handlerErr = err
			return err
		}
		c.failpoint(FailpointBeforeCommit)
		return nil
	})
	if err == nil {
		if !duplicate {
			c.failpoint(FailpointAfterCommit)
		}
		c.infraFailures.Store(0)
		// Acknowledge only now that the effect is committed (or was, by an earlier delivery).
		if err := d.Ack(false); err != nil {
			log.WarnContext(ctx, "ack after commit failed; the broker will redeliver the message and the inbox will skip it",
				slog.Any("error", err))
		}
		if h := c.cfg.Hooks.Processed; h != nil {
			h(c.cfg.Name, d.Type, duplicate, time.Since(start))
		}
		if duplicate {
			log.InfoContext(ctx, "duplicate message skipped", slog.Bool("redelivered", d.Redelivered))
		} else {
			log.DebugContext(ctx, "message processed", slog.Duration("took", time.Since(start)))
		}
		return
	}

	if h := c.cfg.Hooks.HandlerError; h != nil {
		h(c.cfg.Name, d.Type, err)
	}
	switch {
	case ctx.Err() != nil:
		// The shutdown timeout cut the handler short; it rolled back. Not the message's fault.
		log.WarnContext(ctx, "handling cut short by shutdown; the message goes back to the queue", slog.Any("error", err))
		_ = d.Nack(false, true)
	case handlerErr == nil:
		// The database failed (begin, insert, commit), not the handler: no attempt is counted,
		// so an outage does not dead-letter healthy messages. After a failed commit the effect
		// may have happened; the redelivery finds out through the inbox.
		c.requeueLater(s, d, log, "processing failed outside the handler", err)
	case inbox.IsPermanent(handlerErr):
		c.deadLetter(s, d, del, log, ReasonPermanent, handlerErr.Error())
	case del.DeliveryCount >= c.cfg.MaxDeliveries:
		c.deadLetter(s, d, del, log, ReasonMaxDeliveries,
			fmt.Sprintf("failed on all %d attempts; last error: %v", del.DeliveryCount, handlerErr))
	default:
		c.retry(s, d, del, log, handlerErr)
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
		f(name)
	}
}

// retry waits the backoff, republishes a copy of the message with its retry count increased
// to the tail of the queue, and then acknowledges the original.
func (c *Consumer) retry(s *session, d amqp.Delivery, del Delivery, log *slog.Logger, cause error) {
	delay := backoff(c.cfg.RetryDelay, c.cfg.MaxRetryDelay, del.DeliveryCount-1)
	log.WarnContext(s.workCtx, "handler failed; retrying",
		slog.Any("error", cause), slog.Duration("retry_in", delay), slog.Int("max_deliveries", c.cfg.MaxDeliveries))
	if !sleep(s.waitCtx, delay) {
		// Stopping, or the connection is gone: the original goes back to the queue as it is,
		// and this attempt is not counted.
		_ = d.Nack(false, true)
		return
	}
	copied := c.copyOf(d, del)
	delete(copied.Headers, HeaderDeadReason) // a replayed dead letter starts over; its retries do not
	delete(copied.Headers, HeaderOriginalQueue)
	copied.Headers[HeaderRetries] = int32(del.DeliveryCount)
	// The copy is confirmed before the original is acknowledged, so the message exists in the
	// broker at every moment. If the process dies in between, the broker redelivers the
	// original as well: both carry the same message id, so whichever is processed second is
	// absorbed by the inbox as a duplicate.
	if err := s.pub.publish(s.workCtx, "", c.cfg.Queue, copied); err != nil {
		c.requeueLater(s, d, log, "publishing the retry copy failed", err)
		return
	}
	if err := d.Ack(false); err != nil {
		log.WarnContext(s.workCtx, "ack of the retried original failed; the inbox absorbs its redelivery if the copy succeeds first",
			slog.Any("error", err))
	}
	if h := c.cfg.Hooks.Retried; h != nil {
		h(c.cfg.Name, d.Type, del.DeliveryCount)
	}
}

// deadLetter publishes a copy of the message to the dead-letter destination with the reason,
// and acknowledges the original only after the broker confirmed the copy. When that fails
// the original goes back to the queue: a message is never lost.
func (c *Consumer) deadLetter(s *session, d amqp.Delivery, del Delivery, log *slog.Logger, reason, detail string) {
	text := reason + ": " + detail
	if len(text) > maxReasonLen {
		text = text[:maxReasonLen]
	}
	copied := c.copyOf(d, del)
	copied.Headers[HeaderDeadReason] = text
	copied.Headers[HeaderOriginalQueue] = c.cfg.Queue
	// A dead letter must outlive a broker restart and must not expire before someone looks.
	copied.DeliveryMode = amqp.Persistent
	if copied.Expiration != "" {
		copied.Headers[HeaderOriginalExpiration] = copied.Expiration
		copied.Expiration = ""
	}
	if err := s.pub.publish(s.workCtx, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, copied); err != nil {
		c.requeueLater(s, d, log, "dead-lettering failed ("+text+")", err)
		return
	}
	c.infraFailures.Store(0)
	if err := d.Ack(false); err != nil {
		log.WarnContext(s.workCtx, "ack after dead-lettering failed; the message will be redelivered and dead-lettered again",
			slog.Any("error", err))
	}
	if h := c.cfg.Hooks.DeadLettered; h != nil {
		h(c.cfg.Name, d.Type, reason)
	}
	log.WarnContext(s.workCtx, "message dead-lettered", slog.String("reason", text),
		slog.String("dead_letter_exchange", c.cfg.DeadLetterExchange), slog.String("dead_letter_routing_key", c.cfg.DeadLetterRoutingKey))
}

// requeueLater hands the message back to the broker after a backoff that grows with the
// number of consecutive such failures, so an outage does not turn into a hot loop.
func (c *Consumer) requeueLater(s *session, d amqp.Delivery, log *slog.Logger, what string, err error) {
	n := c.infraFailures.Add(1)
	delay := backoff(c.cfg.RetryDelay, c.cfg.MaxRetryDelay, int(min(n-1, 32)))
	log.ErrorContext(s.workCtx, what+"; the message goes back to the queue",
		slog.Any("error", err), slog.Duration("requeue_in", delay))
	sleep(s.waitCtx, delay)
	if err := d.Nack(false, true); err != nil {
		log.DebugContext(s.workCtx, "nack failed; the broker redelivers the message once the channel is gone", slog.Any("error", err))
	}
}

// copyOf returns a publishing with the delivery's body and properties, and its headers plus
// the original exchange and routing key.
func (c *Consumer) copyOf(d amqp.Delivery, del Delivery) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+6)
	maps.Copy(headers, d.Headers)
	headers[HeaderOriginalExchange] = del.Exchange
	headers[HeaderOriginalRoutingKey] = del.RoutingKey
	userID := d.UserId
	if userID != "" && userID != c.user {
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
	if strings.TrimSpace(contentType) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// checkJSON returns why body is not valid JSON, or nil.
func checkJSON(body []byte) error {
	if json.Valid(body) {
		return nil
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	if err == nil {
		err = errors.New("invalid JSON")
	}
	return fmt.Errorf("body is not valid JSON: %w", err)
}

package inboxrabbitmq

import (
	"context"
	"maps"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers the consumer reads and writes. Producers need not set any of them.
const (
	// HeaderRetries counts the retries of a message ([Delivery].DeliveryCount - 1); absent
	// on the original.
	HeaderRetries = "x-outboxshop-retries"
	// HeaderDeadReason on a dead letter says why it was dead-lettered: one of the Reason
	// constants, a colon and the details (e.g. "malformed-json: unexpected end of JSON input").
	HeaderDeadReason = "x-outboxshop-dead-reason"
	// HeaderReplayed counts how often ReplayDeadLetters put a message back into its queue;
	// absent on a message never replayed. On a dead letter it says that the message died again
	// after a replay: by the broker's hand when it also carries the broker's x-death.
	HeaderReplayed = "x-outboxshop-replayed"
	// HeaderOriginalQueue on a dead letter names the queue it was consumed from.
	HeaderOriginalQueue = "x-outboxshop-original-queue"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey keep the exchange and routing key a
	// message was first published with, on retry copies and dead letters.
	HeaderOriginalExchange   = "x-outboxshop-original-exchange"
	HeaderOriginalRoutingKey = "x-outboxshop-original-routing-key"
	// HeaderOriginalExpiration keeps the per-message TTL of a dead letter, which must not
	// expire in the dead-letter queue.
	HeaderOriginalExpiration = "x-outboxshop-original-expiration"
	// HeaderOriginalUserID keeps a user-id property naming another user than the consumer's,
	// which RabbitMQ would refuse to let it publish.
	HeaderOriginalUserID = "x-outboxshop-original-user-id"
)

// headerDeliveryCount is the header in which a quorum queue tells how often it delivered a
// message before. The consumer strips it from the copies it publishes to the queue, which
// the broker counts from zero.
const headerDeliveryCount = "x-delivery-count"

// Handler applies one message inside the inbox transaction tx. It writes its changes through
// tx and must not commit or roll it back. Returning nil commits the changes together with the
// inbox row and acknowledges the message. Returning an error rolls everything back, and
// inbox.Classify(err) decides what follows: a transient error holds the delivery and calls
// the handler again in place, uncounted; an error marked inbox.Permanent dead-letters the
// message; any other error counts an attempt.
//
// A handler may be called again for the same message after an error, a crash or a broker
// outage, but its committed effects happen once. It may run concurrently with other
// invocations ([Config].Concurrency). ctx is cancelled when the consumer stops and the
// handler did not finish within [Config].ShutdownTimeout, and at once on stop when the call
// is a retry of a held delivery.
type Handler func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Delivery is the message passed to a [Handler].
type Delivery struct {
	// ID is the AMQP message-id property, the inbox key. Never empty.
	ID string
	// Type is the AMQP type property.
	Type string
	// Exchange and RoutingKey are those the message was first published with, also on a
	// retry copy.
	Exchange   string
	RoutingKey string
	// Headers are the AMQP headers, including the consumer's own (x-outboxshop-…) and the
	// broker's (x-delivery-count on a quorum queue's redeliveries).
	Headers       amqp.Table
	ContentType   string
	CorrelationID string
	Timestamp     time.Time
	Body          []byte
	// Redelivered is the broker's flag: this copy was delivered before, not acknowledged.
	Redelivered bool
	// DeliveryCount is 1 on the first attempt, 2 on the first retry, and so on up to
	// [Config].MaxDeliveries. Broker redeliveries (Redelivered), transient failures and
	// hand-backs do not count.
	DeliveryCount int
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

// copyOf returns a publishing with the delivery's body and properties, and its headers plus
// the original exchange and routing key. user is the connection's login: a user-id property
// naming anyone else moves to HeaderOriginalUserID.
func copyOf(d amqp.Delivery, del Delivery, user string) amqp.Publishing {
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

// asDeadLetter prepares a copy for the dead-letter destination: it carries the reason text
// and the queue it was consumed from, is persistent, and keeps its per-message TTL in a
// header instead of its expiration: a dead letter must outlive a broker restart and must not
// expire before someone looks.
func asDeadLetter(p *amqp.Publishing, reason, queue string) {
	p.Headers[HeaderDeadReason] = reason
	p.Headers[HeaderOriginalQueue] = queue
	p.DeliveryMode = amqp.Persistent
	if p.Expiration != "" {
		p.Headers[HeaderOriginalExpiration] = p.Expiration
		p.Expiration = ""
	}
}

package outbox

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Well-known header names. Add stores every header; the RabbitMQ publisher also copies
// HeaderCorrelationID into the AMQP correlation-id property.
const (
	HeaderCorrelationID = "correlation_id"
	HeaderCausationID   = "causation_id"
	HeaderTraceparent   = "traceparent"
)

// Message is one event in the outbox.
//
// The fields up to Headers are written by [Add]. CreatedAt and Attempts are read back by the
// relay for the [Publisher] and the [Hooks]; Add ignores them.
type Message struct {
	// ID identifies the message for ever: the relay publishes it as the broker message id and
	// consumers deduplicate on it. Add fills in a time-ordered UUIDv7 when it is zero.
	ID uuid.UUID
	// Exchange and RoutingKey are the destination.
	Exchange   string
	RoutingKey string
	// Type names the event, e.g. "OrderCreated".
	Type string
	// AggregateType and AggregateID are the ordering key: the messages of one aggregate are
	// published in the order they were added.
	AggregateType string
	AggregateID   string
	// Payload is the event body, JSON.
	Payload json.RawMessage
	// Headers travel with the message (HeaderCorrelationID, HeaderCausationID,
	// HeaderTraceparent, …).
	Headers map[string]string

	// CreatedAt is when the row was inserted (the start of the writing transaction).
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts of this row.
	Attempts int
}

// Package events holds what the events of docs/events.md share, whichever service writes
// them: the schema version, the header every event body starts with, the aggregate, and the
// outbox message an event is written as ([Message]).
package events

import (
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// Version is the schema version of every event both services publish and understand.
const Version = 1

// AggregateType is the outbox aggregate type of every event: the saga is per order, and the
// relay publishes the events of one order in the order they were written.
const AggregateType = "order"

// Header is what every event body carries first: its schema version and the order the saga
// is about. An event struct embeds it, so that its fields stand at the top level of the JSON
// object ({"version": 1, "order_id": "…", …}).
type Header struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
}

// NewHeader returns the header of an event about orderID, at [Version].
func NewHeader(orderID uuid.UUID) Header { return Header{Version: Version, OrderID: orderID} }

// Meta is what an event carries besides its body: the correlation id of the saga and the id
// of the message that caused it, if any. The trace context (W3C traceparent, tracestate,
// baggage) is not part of it: outbox.Add records the one of the writing ctx in the event's
// headers.
type Meta struct {
	CorrelationID string
	CausationID   string
}

// Message returns the outbox message of the event typ about the order orderID, for the relay
// to publish to exchange with routingKey: a new UUIDv7 id, the JSON of body as payload, the
// order as aggregate ([AggregateType], the order id), and meta's ids as the headers
// outbox.HeaderCorrelationID and outbox.HeaderCausationID (each only when set).
func Message(exchange, routingKey, typ string, orderID uuid.UUID, meta Meta, body any) (outbox.Message, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return outbox.Message{}, fmt.Errorf("encode %s: %w", typ, err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return outbox.Message{}, fmt.Errorf("new message id: %w", err)
	}
	headers := map[string]string{}
	if meta.CorrelationID != "" {
		headers[outbox.HeaderCorrelationID] = meta.CorrelationID
	}
	if meta.CausationID != "" {
		headers[outbox.HeaderCausationID] = meta.CausationID
	}
	return outbox.Message{
		ID: id, Exchange: exchange, RoutingKey: routingKey, Type: typ,
		AggregateType: AggregateType, AggregateID: orderID.String(),
		Payload: payload, Headers: headers,
	}, nil
}

package orders

import (
	"time"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/events"
)

// Event types (the AMQP type property) and their routing keys, as in docs/events.md.
const (
	EventOrderCreated   = "OrderCreated"
	EventOrderCancelled = "OrderCancelled"
	EventStockReserved  = "StockReserved"
	EventStockRejected  = "StockRejected"
	EventStockReleased  = "StockReleased"

	RoutingKeyOrderCreated   = "order.created"
	RoutingKeyOrderCancelled = "order.cancelled"
	RoutingKeyStockReserved  = "stock.reserved"
	RoutingKeyStockRejected  = "stock.rejected"
	RoutingKeyStockReleased  = "stock.released"
)

// EventVersion is the schema version of every event this service publishes and understands
// (internal/events, the same in both services).
const EventVersion = events.Version

// AggregateType is the outbox aggregate type of the order events: the relay publishes the
// events of one order in the order they were written.
const AggregateType = "order"

// EventItem is an order line in an event.
type EventItem struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// OrderCreated is published when an order is created.
type OrderCreated struct {
	Version    int         `json:"version"`
	OrderID    uuid.UUID   `json:"order_id"`
	CustomerID string      `json:"customer_id"`
	Items      []EventItem `json:"items"`
	CreatedAt  time.Time   `json:"created_at"`
}

// OrderCancelled is published when a cancellation was requested.
type OrderCancelled struct {
	Version     int       `json:"version"`
	OrderID     uuid.UUID `json:"order_id"`
	CancelledAt time.Time `json:"cancelled_at"`
}

// StockEvent is the part of StockReserved, StockRejected and StockReleased this service reads.
// Unknown fields are ignored (adding a field is not a new version).
type StockEvent struct {
	Version int    `json:"version"`
	OrderID string `json:"order_id"`
	// Reason is StockRejected's reason (insufficient_stock, unknown_sku, order_cancelled).
	Reason string `json:"reason,omitempty"`
}

// EventMeta is what an event carries besides its body: the correlation id of the saga (the
// HTTP request id) and the id of the message that caused it. The trace context (W3C
// traceparent, tracestate, baggage) is not part of it: outbox.Add records the one of the
// writing ctx in the event's headers.
type EventMeta struct {
	CorrelationID string
	CausationID   string
}

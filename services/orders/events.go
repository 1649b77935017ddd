package orders

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/input"
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
// events of one order in the order they were written (internal/events, the same in both
// services).
const AggregateType = events.AggregateType

// EventItem is an order line in an event.
type EventItem struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// Versions of OrderCreated (docs/events.md). Version 2 nests the customer ("customer":
// {"id": …} for v1's "customer_id") and calls the order lines "lines" (v1's "items"). The
// service writes the version its setting says (ORDERS_ORDER_CREATED_VERSION): 1 until every
// consumer reads 2, then 2 (docs/events.md#changing-an-event).
const (
	OrderCreatedV1 = 1
	OrderCreatedV2 = 2
)

// OrderCreatedVersions are the versions of OrderCreated this service can write.
func OrderCreatedVersions() []int { return []int{OrderCreatedV1, OrderCreatedV2} }

// NewOrderCreated returns the body of the OrderCreated event of order, in version (one of
// OrderCreatedVersions; any other is an error).
func NewOrderCreated(version int, o Order) (any, error) {
	items := make([]EventItem, len(o.Lines))
	for i, l := range o.Lines {
		items[i] = EventItem{SKU: l.SKU, Quantity: l.Quantity}
	}
	switch version {
	case OrderCreatedV1:
		return OrderCreated{Version: OrderCreatedV1, OrderID: o.ID, CustomerID: o.CustomerID, Items: items, CreatedAt: o.CreatedAt.UTC()}, nil
	case OrderCreatedV2:
		return OrderCreatedV2Event{Version: OrderCreatedV2, OrderID: o.ID, Customer: EventCustomer{ID: o.CustomerID}, Lines: items,
			CreatedAt: o.CreatedAt.UTC()}, nil
	}
	return nil, fmt.Errorf("OrderCreated has no version %d (versions %v)", version, OrderCreatedVersions())
}

// OrderCreatedV2Event is version 2 of OrderCreated.
type OrderCreatedV2Event struct {
	Version   int           `json:"version"`
	OrderID   uuid.UUID     `json:"order_id"`
	Customer  EventCustomer `json:"customer"`
	Lines     []EventItem   `json:"lines"`
	CreatedAt time.Time     `json:"created_at"`
}

// EventCustomer is the customer of an order in an event (OrderCreated version 2).
type EventCustomer struct {
	ID string `json:"id"`
}

// OrderCreated is version 1 of the event published when an order is created.
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

// StockEvent is a StockReserved, StockRejected or StockReleased as this service reads it
// ([DecodeStockEvent]): the part it uses.
type StockEvent struct {
	// Event is the event's type: EventStockReserved, EventStockRejected or EventStockReleased.
	Event   string
	OrderID uuid.UUID
	// Reason is StockRejected's reason (insufficient_stock, unknown_sku, order_cancelled).
	Reason string
}

// errNotStockEvent is the cause of every refusal of DecodeStockEvent.
var errNotStockEvent = errors.New("not a stock event")

// DecodeStockEvent reads the body of a message of type typ as a stock event of a version this
// service understands: typ is EventStockReserved, EventStockRejected or EventStockReleased;
// the body holds one JSON object under the input policy of internal/input (valid UTF-8, no
// duplicate members, field names spelled exactly; fields added in a later release of the
// warehouse are ignored: adding one is not a new version), its version is EventVersion, its
// order_id a UUID in its canonical form and its reason, if any, an identifier
// (input.IdentifierProblem). Every refusal says why: the consumer dead-letters the message
// with it.
func DecodeStockEvent(typ string, body []byte) (StockEvent, error) {
	switch typ {
	case EventStockReserved, EventStockRejected, EventStockReleased:
	default:
		return StockEvent{}, fmt.Errorf("%w: unknown event type %q", errNotStockEvent, typ)
	}
	var raw struct {
		Version int    `json:"version"`
		OrderID string `json:"order_id"`
		Reason  string `json:"reason"`
	}
	if err := input.DecodeJSON(body, &raw, input.DecodeOptions{AllowUnknownFields: true}); err != nil {
		return StockEvent{}, fmt.Errorf("%w: decode %s: %w", errNotStockEvent, typ, err)
	}
	if raw.Version != EventVersion {
		return StockEvent{}, fmt.Errorf("%w: unsupported version %d of %s (want %d)", errNotStockEvent, raw.Version, typ, EventVersion)
	}
	id, ok := input.ParseID(raw.OrderID)
	if !ok {
		return StockEvent{}, fmt.Errorf("%w: %s: order_id %q is not a lowercase UUID", errNotStockEvent, typ, raw.OrderID)
	}
	if p := input.IdentifierProblem(raw.Reason); p != "" {
		return StockEvent{}, fmt.Errorf("%w: %s: reason %s", errNotStockEvent, typ, p)
	}
	return StockEvent{Event: typ, OrderID: id, Reason: raw.Reason}, nil
}

// EventMeta is what an event carries besides its body (internal/events, the same in both
// services): the correlation id of the saga (the HTTP request id) and the id of the message
// that caused it. The trace context is not part of it: outbox.Add records the one of the
// writing ctx in the event's headers.
type EventMeta = events.Meta

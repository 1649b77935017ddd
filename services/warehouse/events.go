package warehouse

import (
	"bytes"
	"encoding/json"
	"math"
	"time"

	"github.com/google/uuid"
)

// EventVersion is the schema version of every event the warehouse reads and writes.
const EventVersion = 1

// Event types (the AMQP type property) and their routing keys, after docs/events.md.
const (
	TypeOrderCreated   = "OrderCreated"
	TypeOrderCancelled = "OrderCancelled"
	TypeStockReserved  = "StockReserved"
	TypeStockRejected  = "StockRejected"
	TypeStockReleased  = "StockReleased"

	RoutingKeyOrderCreated   = "order.created"
	RoutingKeyOrderCancelled = "order.cancelled"
	RoutingKeyStockReserved  = "stock.reserved"
	RoutingKeyStockRejected  = "stock.rejected"
	RoutingKeyStockReleased  = "stock.released"
)

// AggregateType is the outbox aggregate of every event: the saga is per order.
const AggregateType = "order"

// Bounds of an OrderCreated the warehouse accepts. An order beyond them breaks the contract
// and is dead-lettered instead of answered.
const (
	MaxOrderLines   = 1000
	MaxLineQuantity = math.MaxInt32
	MaxSKULength    = 255
)

// OrderCreated is the part of the orders service's OrderCreated event that the warehouse
// uses. Other fields (customer_id, created_at, …) are ignored.
type OrderCreated struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
	// Items as sent; DecodeOrderCreated merges them per SKU and sorts them.
	Items []Line `json:"items"`
}

// OrderCancelled is the part of the orders service's OrderCancelled event that the warehouse
// uses.
type OrderCancelled struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
}

// StockReserved answers an OrderCreated whose every line is now held.
type StockReserved struct {
	Version    int64     `json:"version"`
	OrderID    uuid.UUID `json:"order_id"`
	Items      []Line    `json:"items"`
	ReservedAt time.Time `json:"reserved_at"`
}

// StockRejected answers an OrderCreated for which nothing is held.
type StockRejected struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
	// Reason is ReasonInsufficientStock, ReasonUnknownSKU or ReasonOrderCancelled.
	Reason string `json:"reason"`
	// Shortages lists the lines that could not be reserved (unknown SKUs with available 0);
	// empty for ReasonOrderCancelled.
	Shortages  []Shortage `json:"shortages"`
	RejectedAt time.Time  `json:"rejected_at"`
}

// StockReleased answers an OrderCancelled: nothing is held for the order any more.
type StockReleased struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
	// Items is what was given back; empty when nothing was held.
	Items      []Line    `json:"items"`
	ReleasedAt time.Time `json:"released_at"`
}

// checkVersion reads the version field of an event body. A body that is not a JSON object,
// or whose version is missing or not EventVersion, is refused.
func checkVersion(body []byte) error {
	var env struct {
		Version *json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return Errorf(CodeInvalid, "event body is not a JSON object: %v", err)
	}
	if env.Version == nil {
		return Errorf(CodeInvalid, "event has no version field")
	}
	if v := bytes.TrimSpace(*env.Version); string(v) != "1" {
		return Errorf(CodeInvalid, "unsupported event version %s (this warehouse understands version %d)", v, EventVersion)
	}
	return nil
}

// DecodeOrderCreated parses and checks an OrderCreated body: version 1, a non-nil order id,
// 1 to MaxOrderLines items, each with a non-empty SKU of at most MaxSKULength bytes and a
// quantity from 1 to MaxLineQuantity. The items it returns are merged per SKU and sorted.
// Errors are *Error with CodeInvalid.
func DecodeOrderCreated(body []byte) (OrderCreated, error) {
	if err := checkVersion(body); err != nil {
		return OrderCreated{}, err
	}
	var ev OrderCreated
	if err := json.Unmarshal(body, &ev); err != nil {
		return OrderCreated{}, Errorf(CodeInvalid, "decode OrderCreated: %v", err)
	}
	if ev.OrderID == uuid.Nil {
		return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated has no order_id")
	}
	if len(ev.Items) == 0 || len(ev.Items) > MaxOrderLines {
		return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated must have 1 to %d items, has %d", MaxOrderLines, len(ev.Items))
	}
	for i, l := range ev.Items {
		if l.SKU == "" || len(l.SKU) > MaxSKULength {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated items[%d]: sku must have 1 to %d bytes", i, MaxSKULength)
		}
		if l.Quantity < 1 || l.Quantity > MaxLineQuantity {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated items[%d] (%s): quantity must be 1 to %d, is %d", i, l.SKU, MaxLineQuantity, l.Quantity)
		}
	}
	ev.Items = MergeLines(ev.Items)
	return ev, nil
}

// DecodeOrderCancelled parses and checks an OrderCancelled body: version 1 and a non-nil
// order id. Errors are *Error with CodeInvalid.
func DecodeOrderCancelled(body []byte) (OrderCancelled, error) {
	if err := checkVersion(body); err != nil {
		return OrderCancelled{}, err
	}
	var ev OrderCancelled
	if err := json.Unmarshal(body, &ev); err != nil {
		return OrderCancelled{}, Errorf(CodeInvalid, "decode OrderCancelled: %v", err)
	}
	if ev.OrderID == uuid.Nil {
		return OrderCancelled{}, Errorf(CodeInvalid, "OrderCancelled has no order_id")
	}
	return ev, nil
}

// nonNil returns s, or an empty slice for nil, so that JSON shows [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// NewStockReserved returns the StockReserved event for an order whose lines are now held.
func NewStockReserved(orderID uuid.UUID, lines []Line, at time.Time) StockReserved {
	return StockReserved{Version: EventVersion, OrderID: orderID, Items: nonNil(lines), ReservedAt: at.UTC()}
}

// NewStockRejected returns the StockRejected event for an order for which nothing is held.
func NewStockRejected(orderID uuid.UUID, reason string, shortages []Shortage, at time.Time) StockRejected {
	return StockRejected{Version: EventVersion, OrderID: orderID, Reason: reason, Shortages: nonNil(shortages), RejectedAt: at.UTC()}
}

// NewStockReleased returns the StockReleased event for a cancelled order; lines is what was
// given back (none when nothing was held).
func NewStockReleased(orderID uuid.UUID, lines []Line, at time.Time) StockReleased {
	return StockReleased{Version: EventVersion, OrderID: orderID, Items: nonNil(lines), ReleasedAt: at.UTC()}
}

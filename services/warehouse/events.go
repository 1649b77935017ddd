package warehouse

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/input"
)

// EventVersion is the schema version of every event the warehouse reads and writes
// (internal/events, the same in both services).
const EventVersion = events.Version

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

// AggregateType is the outbox aggregate of every event: the saga is per order
// (internal/events, the same in both services).
const AggregateType = events.AggregateType

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
	events.Header
	// Items as sent; DecodeOrderCreated merges them per SKU and sorts them.
	Items []Line `json:"items"`
}

// OrderCancelled is the part of the orders service's OrderCancelled event that the warehouse
// uses.
type OrderCancelled struct{ events.Header }

// StockReserved answers an OrderCreated whose every line is now held.
type StockReserved struct {
	events.Header
	Items      []Line    `json:"items"`
	ReservedAt time.Time `json:"reserved_at"`
}

// StockRejected answers an OrderCreated for which nothing is held.
type StockRejected struct {
	events.Header
	// Reason is ReasonInsufficientStock, ReasonUnknownSKU or ReasonOrderCancelled.
	Reason string `json:"reason"`
	// Shortages lists the lines that could not be reserved (unknown SKUs with available 0);
	// empty for ReasonOrderCancelled.
	Shortages  []Shortage `json:"shortages"`
	RejectedAt time.Time  `json:"rejected_at"`
}

// StockReleased answers an OrderCancelled: nothing is held for the order any more.
type StockReleased struct {
	events.Header
	// Items is what was given back; empty when nothing was held.
	Items      []Line    `json:"items"`
	ReleasedAt time.Time `json:"released_at"`
}

// EventMeta is what an answer carries besides its body (internal/events, the same in both
// services): the correlation id of the saga (the consumed message's) and the id of the
// message that caused it, the consumed one. The trace context is not part of it: the outbox
// (outbox.QueueAdd) records the one of the writing ctx, the consumer's process span, in the
// answer's headers.
type EventMeta = events.Meta

// decodeEvent reads an event body under the input policy of internal/input (valid UTF-8, one
// JSON object, no duplicate members, no lone surrogate escapes, field names spelled exactly;
// fields it does not know are ignored: adding one is not a new version) into v, after
// checking that its version is EventVersion. Errors are *Error with CodeInvalid.
func decodeEvent(typ string, body []byte, v any) error {
	var env struct {
		Version json.RawMessage `json:"version"`
	}
	opts := input.DecodeOptions{AllowUnknownFields: true}
	if err := input.DecodeJSON(body, &env, opts); err != nil {
		return Errorf(CodeInvalid, "event body is not a JSON object we accept: %s", inputMessage(err))
	}
	if env.Version == nil || string(env.Version) == "null" {
		return Errorf(CodeInvalid, "event has no version field")
	}
	if string(env.Version) != "1" {
		return Errorf(CodeInvalid, "unsupported event version %s (this warehouse understands version %d)", env.Version, EventVersion)
	}
	if err := input.DecodeJSON(body, v, opts); err != nil {
		return Errorf(CodeInvalid, "decode %s: %s", typ, inputMessage(err))
	}
	return nil
}

// inputMessage is the message of an input-policy refusal, with its field errors.
func inputMessage(err error) string {
	in, ok := errors.AsType[*input.Error](err)
	if !ok {
		return err.Error()
	}
	msg := in.Message
	for _, f := range in.Fields {
		msg += " " + f.Field + " " + f.Message + "."
	}
	return strings.TrimSuffix(msg, ".")
}

// eventOrderID reads the order_id of an event: a UUID in its canonical form (input.ParseID),
// not nil.
func eventOrderID(typ, raw string) (uuid.UUID, error) {
	id, ok := input.ParseID(raw)
	switch {
	case raw == "":
		return uuid.Nil, Errorf(CodeInvalid, "%s has no order_id", typ)
	case !ok:
		return uuid.Nil, Errorf(CodeInvalid, "%s order_id %q is not a lowercase UUID", typ, raw)
	case id == uuid.Nil:
		return uuid.Nil, Errorf(CodeInvalid, "%s has the nil UUID as order_id", typ)
	}
	return id, nil
}

// DecodeOrderCreated parses and checks an OrderCreated body: version 1, an order id in its
// canonical form and not nil, 1 to MaxOrderLines items, each with a SKU of 1 to
// MaxSKULength bytes that an identifier may be (input.IdentifierProblem: no NUL, control or
// bidirectional formatting characters) and a quantity from 1 to MaxLineQuantity. The items
// it returns are merged per SKU and sorted. Errors are *Error with CodeInvalid.
func DecodeOrderCreated(body []byte) (OrderCreated, error) {
	var raw struct {
		OrderID string `json:"order_id"`
		Items   []Line `json:"items"`
	}
	if err := decodeEvent(TypeOrderCreated, body, &raw); err != nil {
		return OrderCreated{}, err
	}
	id, err := eventOrderID(TypeOrderCreated, raw.OrderID)
	if err != nil {
		return OrderCreated{}, err
	}
	ev := OrderCreated{Header: events.NewHeader(id), Items: raw.Items}
	if len(ev.Items) == 0 || len(ev.Items) > MaxOrderLines {
		return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated must have 1 to %d items, has %d", MaxOrderLines, len(ev.Items))
	}
	for i, l := range ev.Items {
		if l.SKU == "" || len(l.SKU) > MaxSKULength {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated items[%d]: sku must have 1 to %d bytes", i, MaxSKULength)
		}
		if p := input.IdentifierProblem(l.SKU); p != "" {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated items[%d]: sku %s", i, p)
		}
		if l.Quantity < 1 || l.Quantity > MaxLineQuantity {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated items[%d] (%s): quantity must be 1 to %d, is %d", i, l.SKU, MaxLineQuantity, l.Quantity)
		}
	}
	ev.Items = MergeLines(ev.Items)
	return ev, nil
}

// DecodeOrderCancelled parses and checks an OrderCancelled body: version 1 and an order id in
// its canonical form, not nil. Errors are *Error with CodeInvalid.
func DecodeOrderCancelled(body []byte) (OrderCancelled, error) {
	var raw struct {
		OrderID string `json:"order_id"`
	}
	if err := decodeEvent(TypeOrderCancelled, body, &raw); err != nil {
		return OrderCancelled{}, err
	}
	id, err := eventOrderID(TypeOrderCancelled, raw.OrderID)
	if err != nil {
		return OrderCancelled{}, err
	}
	return OrderCancelled{events.NewHeader(id)}, nil
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
	return StockReserved{Header: events.NewHeader(orderID), Items: nonNil(lines), ReservedAt: at.UTC()}
}

// NewStockRejected returns the StockRejected event for an order for which nothing is held.
func NewStockRejected(orderID uuid.UUID, reason string, shortages []Shortage, at time.Time) StockRejected {
	return StockRejected{Header: events.NewHeader(orderID), Reason: reason, Shortages: nonNil(shortages), RejectedAt: at.UTC()}
}

// NewStockReleased returns the StockReleased event for a cancelled order; lines is what was
// given back (none when nothing was held).
func NewStockReleased(orderID uuid.UUID, lines []Line, at time.Time) StockReleased {
	return StockReleased{Header: events.NewHeader(orderID), Items: nonNil(lines), ReleasedAt: at.UTC()}
}

package warehouse

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/input"
)

// EventVersion is the schema version of every event the warehouse writes, and of
// OrderCancelled, which it reads (internal/events, the same in both services); OrderCreated
// has two (OrderCreatedVersions).
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

// Versions of OrderCreated (docs/events.md). Version 2 nests the customer ("customer": {"id":
// …} for v1's "customer_id") and calls the order lines "lines" (v1's "items"); the warehouse
// reads both, and upgrades a v1 body to the v2 shape in one place (UpgradeOrderCreatedV1)
// before it checks it.
const (
	OrderCreatedV1 = 1
	OrderCreatedV2 = 2
)

// OrderCreatedVersions are the versions of OrderCreated this warehouse reads, oldest first.
func OrderCreatedVersions() []int { return []int{OrderCreatedV1, OrderCreatedV2} }

// OrderCreated is the part of the orders service's OrderCreated event that the warehouse
// uses, in the v2 shape whichever version was sent. Other fields (customer, created_at, …)
// are ignored.
type OrderCreated struct {
	// Header's Version is the version the event was sent with (OrderCreatedV1 or
	// OrderCreatedV2).
	events.Header
	// Lines as sent; DecodeOrderCreated merges them per SKU and sorts them.
	Lines []Line `json:"lines"`
}

// OrderCreatedV2Body is the part of a version 2 OrderCreated body that the warehouse reads:
// what UpgradeOrderCreatedV1 turns a v1 body into. (The customer, which v2 nests, is not the
// warehouse's business in either version.)
type OrderCreatedV2Body struct {
	OrderID string `json:"order_id"`
	Lines   []Line `json:"lines"`
}

// OrderCreatedV1Body is the part of a version 1 OrderCreated body that the warehouse reads.
type OrderCreatedV1Body struct {
	OrderID string `json:"order_id"`
	Items   []Line `json:"items"`
}

// UpgradeOrderCreatedV1 is the one place a v1 OrderCreated becomes a v2 one: items become
// lines. It checks nothing: DecodeOrderCreated checks the v2 shape it returns, whichever
// version was sent. Remove it with v1 support (docs/events.md#changing-an-event).
func UpgradeOrderCreatedV1(v1 OrderCreatedV1Body) OrderCreatedV2Body {
	return OrderCreatedV2Body{OrderID: v1.OrderID, Lines: v1.Items}
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
// fields it does not know are ignored: adding one is not a new version) and returns its
// version, after checking that it is one of accepted. Errors are *Error with CodeInvalid.
func decodeEvent(typ string, body []byte, accepted []int) (int, error) {
	var env struct {
		Version json.RawMessage `json:"version"`
	}
	opts := input.DecodeOptions{AllowUnknownFields: true}
	if err := input.DecodeJSON(body, &env, opts); err != nil {
		return 0, Errorf(CodeInvalid, "event body is not a JSON object we accept: %s", inputMessage(err))
	}
	if env.Version == nil || string(env.Version) == "null" {
		return 0, Errorf(CodeInvalid, "event has no version field")
	}
	for _, v := range accepted {
		if string(env.Version) == strconv.Itoa(v) {
			return v, nil
		}
	}
	return 0, Errorf(CodeInvalid, "unsupported %s version %s (this warehouse reads %s)", typ, env.Version, versionList(accepted))
}

// decodeBody decodes an event body that decodeEvent accepted into v.
func decodeBody(typ string, body []byte, v any) error {
	if err := input.DecodeJSON(body, v, input.DecodeOptions{AllowUnknownFields: true}); err != nil {
		return Errorf(CodeInvalid, "decode %s: %s", typ, inputMessage(err))
	}
	return nil
}

// versionList is "version 1" or "versions 1 and 2" or "versions 1, 2 and 3".
func versionList(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	switch len(s) {
	case 0:
		return "no version"
	case 1:
		return "version " + s[0]
	}
	return "versions " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
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

// DecodeOrderCreated parses and checks an OrderCreated body of one of the versions in
// accepted (nil: OrderCreatedVersions, every version this warehouse reads). A v1 body is
// upgraded to the v2 shape first (UpgradeOrderCreatedV1); the v2 shape must have an order id
// in its canonical form and not nil, and 1 to MaxOrderLines lines, each with a SKU of 1 to
// MaxSKULength bytes that an identifier may be (input.IdentifierProblem: no NUL, control or
// bidirectional formatting characters) and a quantity from 1 to MaxLineQuantity. The lines
// it returns are merged per SKU and sorted. Errors are *Error with CodeInvalid; a version
// not in accepted is refused with a message that names the versions it reads.
func DecodeOrderCreated(body []byte, accepted []int) (OrderCreated, error) {
	if accepted == nil {
		accepted = OrderCreatedVersions()
	}
	version, err := decodeEvent(TypeOrderCreated, body, accepted)
	if err != nil {
		return OrderCreated{}, err
	}
	var raw OrderCreatedV2Body
	switch version {
	case OrderCreatedV1:
		var v1 OrderCreatedV1Body
		if err := decodeBody(TypeOrderCreated, body, &v1); err != nil {
			return OrderCreated{}, err
		}
		raw = UpgradeOrderCreatedV1(v1)
	case OrderCreatedV2:
		if err := decodeBody(TypeOrderCreated, body, &raw); err != nil {
			return OrderCreated{}, err
		}
	default:
		return OrderCreated{}, Errorf(CodeInvalid, "unsupported %s version %d (this warehouse reads %s)",
			TypeOrderCreated, version, versionList(OrderCreatedVersions()))
	}
	id, err := eventOrderID(TypeOrderCreated, raw.OrderID)
	if err != nil {
		return OrderCreated{}, err
	}
	// A refusal names the lines as the body did: items in v1.
	lines := "lines"
	if version == OrderCreatedV1 {
		lines = "items"
	}
	ev := OrderCreated{Header: events.Header{Version: int64(version), OrderID: id}, Lines: raw.Lines}
	if len(ev.Lines) == 0 || len(ev.Lines) > MaxOrderLines {
		return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated must have 1 to %d %s, has %d", MaxOrderLines, lines, len(ev.Lines))
	}
	for i, l := range ev.Lines {
		if l.SKU == "" || len(l.SKU) > MaxSKULength {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated %s[%d]: sku must have 1 to %d bytes", lines, i, MaxSKULength)
		}
		if p := input.IdentifierProblem(l.SKU); p != "" {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated %s[%d]: sku %s", lines, i, p)
		}
		if l.Quantity < 1 || l.Quantity > MaxLineQuantity {
			return OrderCreated{}, Errorf(CodeInvalid, "OrderCreated %s[%d] (%s): quantity must be 1 to %d, is %d", lines, i, l.SKU, MaxLineQuantity, l.Quantity)
		}
	}
	ev.Lines = MergeLines(ev.Lines)
	return ev, nil
}

// DecodeOrderCancelled parses and checks an OrderCancelled body: version 1 and an order id in
// its canonical form, not nil. Errors are *Error with CodeInvalid.
func DecodeOrderCancelled(body []byte) (OrderCancelled, error) {
	if _, err := decodeEvent(TypeOrderCancelled, body, []int{EventVersion}); err != nil {
		return OrderCancelled{}, err
	}
	var raw struct {
		OrderID string `json:"order_id"`
	}
	if err := decodeBody(TypeOrderCancelled, body, &raw); err != nil {
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

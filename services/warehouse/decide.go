package warehouse

import (
	"fmt"

	"github.com/google/uuid"
)

// Action is what a message does to an order's reservation.
type Action string

// The actions [DecideCreated], [CheckStock] and [DecideCancelled] choose from.
const (
	// ActionReserve: take every line from stock and hold it; answer StockReserved.
	ActionReserve Action = "reserve"
	// ActionReject: hold nothing; answer StockRejected with Decision.Reason.
	ActionReject Action = "reject"
	// ActionRelease: give the held lines back to stock (RELEASED); answer StockReleased with
	// them.
	ActionRelease Action = "release"
	// ActionTombstone: the order is unknown; record it as CANCELLED so that a late
	// OrderCreated reserves nothing; answer StockReleased with no items.
	ActionTombstone Action = "tombstone"
	// ActionAcknowledgeCancel: nothing is held (the order was rejected); record the
	// cancellation and answer StockReleased with no items.
	ActionAcknowledgeCancel Action = "acknowledge_cancel"
	// ActionIgnore: the message changes nothing and is answered by nothing (Decision.Why says
	// why); it is logged and acknowledged.
	ActionIgnore Action = "ignore"
)

// Decision is the outcome of a rule.
type Decision struct {
	Action Action
	// Reason is the StockRejected reason, for ActionReject.
	Reason string
	// Shortages lists the lines that could not be reserved, for ActionReject because of
	// stock (unknown SKUs with Available 0).
	Shortages []Shortage
	// Why explains an ActionIgnore, for the log.
	Why string
}

// DecideCreated decides what an OrderCreated does, given the order's reservation (nil when the
// warehouse has never heard of the order):
//
//   - no reservation: ActionReserve, subject to [CheckStock];
//   - a tombstone (CANCELLED, the order never seen): ActionReject with
//     ReasonOrderCancelled;
//   - anything else was decided by an earlier OrderCreated: ActionIgnore.
func DecideCreated(existing *Reservation) Decision {
	switch {
	case existing == nil:
		return Decision{Action: ActionReserve}
	case existing.Status == StatusCancelled && existing.CreatedMessageID == "":
		return Decision{Action: ActionReject, Reason: ReasonOrderCancelled}
	default:
		return Decision{Action: ActionIgnore, Why: fmt.Sprintf(
			"the order was already handled by OrderCreated message %q (reservation %s)", existing.CreatedMessageID, existing.Status)}
	}
}

// CheckStock decides whether lines (merged, see [MergeLines]) can all be reserved from
// available, the current stock of their SKUs (a SKU missing from the map is unknown). It is
// all or nothing: ActionReserve when every line fits, else ActionReject with every line that
// does not, and the reason ReasonUnknownSKU when any SKU is unknown, ReasonInsufficientStock
// otherwise.
func CheckStock(lines []Line, available map[string]int64) Decision {
	var (
		shortages []Shortage
		unknown   bool
	)
	for _, l := range lines {
		have, ok := available[l.SKU]
		if !ok {
			unknown = true
		}
		if !ok || have < l.Quantity {
			shortages = append(shortages, Shortage{SKU: l.SKU, Requested: l.Quantity, Available: have})
		}
	}
	switch {
	case unknown:
		return Decision{Action: ActionReject, Reason: ReasonUnknownSKU, Shortages: shortages}
	case len(shortages) > 0:
		return Decision{Action: ActionReject, Reason: ReasonInsufficientStock, Shortages: shortages}
	default:
		return Decision{Action: ActionReserve}
	}
}

// DecideCancelled decides what an OrderCancelled does, given the order's reservation (nil when
// the warehouse has never heard of the order):
//
//   - no reservation: ActionTombstone (the cancellation overtook the order);
//   - RESERVED: ActionRelease;
//   - REJECTED, not cancelled before: ActionAcknowledgeCancel;
//   - RELEASED, CANCELLED, or REJECTED and already cancelled: ActionIgnore. The first
//     cancellation was answered already; a second StockReleased would be an illegal
//     transition for the orders service, so none is sent.
func DecideCancelled(existing *Reservation) Decision {
	switch {
	case existing == nil:
		return Decision{Action: ActionTombstone}
	case existing.Status == StatusReserved:
		return Decision{Action: ActionRelease}
	case existing.Status == StatusRejected && existing.CancelledMessageID == "":
		return Decision{Action: ActionAcknowledgeCancel}
	default:
		return Decision{Action: ActionIgnore, Why: fmt.Sprintf(
			"the cancellation was already answered (reservation %s, OrderCancelled message %q)", existing.Status, existing.CancelledMessageID)}
	}
}

// OrderOutcome is what applying an OrderCreated or an OrderCancelled did.
type OrderOutcome struct {
	Decision Decision
	// Released is what an OrderCancelled gave back to stock (none unless ActionRelease).
	Released []Line
	// AnswerID is the id of the answer written to the outbox (StockReserved, StockRejected
	// or StockReleased); uuid.Nil for ActionIgnore, which is answered by nothing.
	AnswerID uuid.UUID
}

// String describes a decision for logs.
func (d Decision) String() string {
	if d.Reason != "" {
		return fmt.Sprintf("%s (%s)", d.Action, d.Reason)
	}
	return string(d.Action)
}

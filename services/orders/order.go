package orders

import (
	"time"

	"github.com/google/uuid"
)

// Status is where an order is in the saga.
type Status string

// The statuses of an order (docs/events.md, "The saga").
const (
	StatusPending    Status = "PENDING"
	StatusReserved   Status = "RESERVED"
	StatusRejected   Status = "REJECTED"
	StatusCancelling Status = "CANCELLING"
	StatusCancelled  Status = "CANCELLED"
)

// Valid reports whether s is one of the statuses above.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusReserved, StatusRejected, StatusCancelling, StatusCancelled:
		return true
	}
	return false
}

// Order is an order with its lines and the history of its status changes, oldest first.
type Order struct {
	ID         uuid.UUID
	CustomerID string
	Status     Status
	Lines      []Line
	CreatedAt  time.Time
	UpdatedAt  time.Time
	History    []StatusChange
}

// Line is one line of an order.
type Line struct {
	SKU      string
	Name     string // the product's name in the catalogue
	Quantity int
}

// StatusChange is one row of an order's history.
type StatusChange struct {
	// From is the status before the change; empty for the creation.
	From Status
	// To is the status after the change.
	To Status
	// Event is what caused the change: EventOrderCreated and EventOrderCancelled for the API's
	// own actions, the consumed event's type otherwise.
	Event string
	// Reason is the warehouse's reason for a StockRejected, empty otherwise.
	Reason string
	// MessageID is the id of the consumed message that caused the change, empty for API
	// actions.
	MessageID string
	At        time.Time
}

// Next returns the status an order in status from moves to when event happens, and false when
// the event is not a legal transition from that status (docs/events.md: logged and
// acknowledged, never an error).
//
// event is one of the consumed event types (EventStockReserved, EventStockRejected,
// EventStockReleased) or EventOrderCancelled for a cancellation requested through the API.
func Next(from Status, event string) (Status, bool) {
	switch {
	case from == StatusPending && event == EventStockReserved:
		return StatusReserved, true
	case from == StatusPending && event == EventStockRejected:
		return StatusRejected, true
	case (from == StatusPending || from == StatusReserved) && event == EventOrderCancelled:
		return StatusCancelling, true
	case from == StatusCancelling && event == EventStockReleased:
		return StatusCancelled, true
	}
	return from, false
}

// CancelOutcome is what a cancellation request does to an order in a given status.
type CancelOutcome int

const (
	// CancelStart moves the order to CANCELLING and emits OrderCancelled.
	CancelStart CancelOutcome = iota
	// CancelAlready: the order is already CANCELLING or CANCELLED; nothing changes, and the
	// request succeeds (cancelling is idempotent).
	CancelAlready
	// CancelRefused: the order cannot be cancelled any more (REJECTED).
	CancelRefused
)

// Cancel tells what a cancellation request does to an order in status s.
func Cancel(s Status) CancelOutcome {
	switch s {
	case StatusCancelling, StatusCancelled:
		return CancelAlready
	case StatusPending, StatusReserved:
		return CancelStart
	}
	return CancelRefused
}

// StockUpdate is a consumed stock event, for the repository to apply.
type StockUpdate struct {
	Event     string // EventStockReserved, EventStockRejected or EventStockReleased
	OrderID   uuid.UUID
	Reason    string // StockRejected's reason
	MessageID string
}

// StockOutcome is what applying a StockUpdate did.
type StockOutcome struct {
	// Found is false when no order has the id: nothing was written.
	Found bool
	// From is the order's status before; To is the status after (equal to From when the
	// transition was illegal).
	From, To Status
	// Applied is false for an illegal transition: nothing was written.
	Applied bool
}

package warehouse

import (
	"cmp"
	"regexp"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Limits of the stock API.
const (
	// MaxAvailable is the largest stock level PUT /stock/{sku} accepts.
	MaxAvailable = 1_000_000
	// MaxNameLength bounds a product name, in characters.
	MaxNameLength = 200
)

// skuPattern is what a SKU of the catalogue looks like: letters, digits, '.', '_' and '-',
// starting with a letter or digit, at most 64 characters.
var skuPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidSKU reports whether s may name a SKU of the catalogue. An OrderCreated may still name
// any other string: such a line is simply unknown and the order is rejected.
func ValidSKU(s string) bool { return skuPattern.MatchString(s) }

// StockItem is one SKU of the catalogue.
type StockItem struct {
	SKU  string
	Name string
	// Available is what can still be reserved.
	Available int64
	// Reserved is what RESERVED reservations hold (not part of Available).
	Reserved  int64
	UpdatedAt time.Time
	// Version grows with every change of the row (a reservation, a release, a write of the
	// API): the HTTP API's ETag.
	Version int64
}

// Precondition is what a write of a SKU's stock requires of the SKU as it is (the HTTP API's
// If-Match and If-None-Match), so that an operator's write based on an old read cannot
// overwrite a change made since, such as a reservation. The zero value requires nothing.
type Precondition struct {
	// Versions: the SKU must exist with one of these versions (If-Match with ETags).
	Versions []int64
	// Exists: the SKU must exist, whatever its version (If-Match: *).
	Exists bool
	// Absent: the SKU must not exist yet (If-None-Match: *): the write creates it.
	Absent bool
}

// Check returns nil when a SKU that exists (or not) with version satisfies p, else an error
// with CodePreconditionFailed.
func (p Precondition) Check(sku string, exists bool, version int64) error {
	switch {
	case !exists && (p.Exists || len(p.Versions) > 0):
		return Errorf(CodePreconditionFailed, "SKU %q does not exist; create it with If-None-Match: *.", sku)
	case exists && p.Absent:
		return Errorf(CodePreconditionFailed, "SKU %q exists already; change it with If-Match and the ETag of GET /stock/%s.", sku, sku)
	case exists && len(p.Versions) > 0 && !slices.Contains(p.Versions, version):
		return Errorf(CodePreconditionFailed,
			"SKU %q changed since it was read (a reservation, say); read it again with GET /stock/%s and retry with its ETag.", sku, sku)
	}
	return nil
}

// Line is a quantity of one SKU, in an order or a reservation.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// Shortage is a line that cannot be reserved: Available is what there is (0 for an unknown
// SKU).
type Shortage struct {
	SKU       string `json:"sku"`
	Requested int64  `json:"requested"`
	Available int64  `json:"available"`
}

// Status is the state of a reservation.
type Status string

// The reservation states; see the package documentation for the transitions.
const (
	// StatusReserved: every line of the order is held for it.
	StatusReserved Status = "RESERVED"
	// StatusRejected: nothing is held; Reason says why.
	StatusRejected Status = "REJECTED"
	// StatusReleased: the lines were held and were given back when the order was cancelled.
	StatusReleased Status = "RELEASED"
	// StatusCancelled: the cancellation arrived before the order (a tombstone). Nothing is
	// held, and a late OrderCreated reserves nothing.
	StatusCancelled Status = "CANCELLED"
)

// Holds reports whether a reservation in this state holds stock.
func (s Status) Holds() bool { return s == StatusReserved }

// Reasons given in StockRejected and stored on a reservation.
const (
	ReasonInsufficientStock = "insufficient_stock"
	ReasonUnknownSKU        = "unknown_sku"
	ReasonOrderCancelled    = "order_cancelled"
)

// Reservation is what the warehouse did for one order.
type Reservation struct {
	OrderID uuid.UUID
	Status  Status
	// Reason is empty for RESERVED, a Reason* constant otherwise.
	Reason string
	// Lines are the order's lines (merged per SKU, sorted). They are held only while Status
	// is RESERVED; for RELEASED they are what was given back; for REJECTED and CANCELLED
	// they are what the order asked for (empty when the order itself never arrived).
	Lines []Line
	// CreatedMessageID and CancelledMessageID are the ids of the OrderCreated and
	// OrderCancelled messages that acted on this reservation; empty when none did yet.
	CreatedMessageID   string
	CancelledMessageID string
	CreatedAt          time.Time
	UpdatedAt          time.Time
}

// CatalogueItem is a SKU the warehouse starts with.
type CatalogueItem struct {
	SKU       string
	Name      string
	Available int64
}

// Catalogue is the stock of a fresh warehouse: the migration seeds it, and `warehouse seed`
// resets the stock to it.
var Catalogue = []CatalogueItem{
	{SKU: "BAG-1", Name: "Saga tote bag", Available: 10},
	{SKU: "BOOK-1", Name: "The Go Programming Language", Available: 100},
	{SKU: "MUG-1", Name: "Outbox mug", Available: 50},
	{SKU: "PEN-1", Name: "Idempotent pen", Available: 200},
	{SKU: "TEE-1", Name: "Inbox T-shirt", Available: 30},
}

// SKUs returns the SKUs of lines, in order.
func SKUs(lines []Line) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.SKU
	}
	return out
}

// Quantities returns the quantities of lines, in order.
func Quantities(lines []Line) []int64 {
	out := make([]int64, len(lines))
	for i, l := range lines {
		out[i] = l.Quantity
	}
	return out
}

// MergeLines returns lines with one line per SKU (quantities added up), sorted by SKU. The
// caller has checked that every quantity is positive and bounded.
func MergeLines(lines []Line) []Line {
	byKey := make(map[string]int64, len(lines))
	for _, l := range lines {
		byKey[l.SKU] += l.Quantity
	}
	out := make([]Line, 0, len(byKey))
	for sku, q := range byKey {
		out = append(out, Line{SKU: sku, Quantity: q})
	}
	slices.SortFunc(out, func(a, b Line) int { return cmp.Compare(a.SKU, b.SKU) })
	return out
}

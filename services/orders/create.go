package orders

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/input"
)

// The rules of a new order.
const (
	// MaxLines is the most lines an order may have.
	MaxLines = 50
	// MaxQuantity is the largest quantity of one line.
	MaxQuantity = 1000
	// MaxCustomerIDLength and MaxSKULength bound those strings, in characters.
	MaxCustomerIDLength = 255
	MaxSKULength        = 64
	// MaxIdempotencyKeyLength is the longest Idempotency-Key accepted, in bytes.
	MaxIdempotencyKeyLength = 255
)

// OrderRequest is a request to create an order; Validate checks it against the rules, and
// the http package's decoder returns only valid ones. The SKUs are checked against the
// catalogue when the order is written.
type OrderRequest struct {
	CustomerID string
	Items      []Item
}

// Item is one requested line.
type Item struct {
	SKU      string
	Quantity int
}

// CustomerIDProblem returns what is wrong with a customer id, or "": it is required, at most
// MaxCustomerIDLength characters, and holds no character an identifier may not
// (input.IdentifierProblem: NUL, control and bidirectional formatting characters).
func CustomerIDProblem(id string) string {
	switch {
	case strings.TrimSpace(id) == "":
		return "is required"
	case utf8.RuneCountInString(id) > MaxCustomerIDLength:
		return fmt.Sprintf("must be at most %d characters long", MaxCustomerIDLength)
	}
	return input.IdentifierProblem(id)
}

// LinesProblem returns what is wrong with an order of n lines, or "": 1 to MaxLines.
func LinesProblem(n int) string {
	switch {
	case n == 0:
		return "must have at least one line"
	case n > MaxLines:
		return fmt.Sprintf("must have at most %d lines, not %d", MaxLines, n)
	}
	return ""
}

// SKUProblem returns what is wrong with a line's SKU, or "": it is required, at most
// MaxSKULength characters, and holds no character an identifier may not. (Two lines of one
// order must not have the same SKU either.)
func SKUProblem(sku string) string {
	switch {
	case strings.TrimSpace(sku) == "":
		return "is required"
	case utf8.RuneCountInString(sku) > MaxSKULength:
		return fmt.Sprintf("must be at most %d characters long", MaxSKULength)
	}
	return input.IdentifierProblem(sku)
}

// QuantityProblem returns what is wrong with a line's quantity, or "": 1 to MaxQuantity.
func QuantityProblem(n int64) string {
	switch {
	case n < 1:
		return "must be at least 1"
	case n > MaxQuantity:
		return fmt.Sprintf("must be at most %d", MaxQuantity)
	}
	return ""
}

// DuplicateSKUProblem is the problem of a line whose SKU is already on line first: the whole
// quantity of a SKU goes on one line.
func DuplicateSKUProblem(sku string, first int) string {
	return fmt.Sprintf("%q is already on items[%d]: put the whole quantity on one line", sku, first)
}

// Validate reports every rule r breaks (the Problem functions above), or nil.
func (r OrderRequest) Validate() error {
	var errs []error
	if CustomerIDProblem(r.CustomerID) != "" {
		errs = append(errs, fmt.Errorf("customer_id %q", r.CustomerID))
	}
	if LinesProblem(len(r.Items)) != "" {
		errs = append(errs, fmt.Errorf("%d items", len(r.Items)))
	}
	seen := map[string]bool{}
	for i, it := range r.Items {
		if SKUProblem(it.SKU) != "" || seen[it.SKU] {
			errs = append(errs, fmt.Errorf("items[%d].sku %q", i, it.SKU))
		}
		seen[it.SKU] = true
		if QuantityProblem(int64(it.Quantity)) != "" {
			errs = append(errs, fmt.Errorf("items[%d].quantity %d", i, it.Quantity))
		}
	}
	return errors.Join(errs...)
}

// Fingerprint is the SHA-256 of the request in canonical form: the customer id and the lines
// sorted by SKU, as compact JSON. Two bodies that differ only in white space, key order or the
// order of their lines have the same fingerprint; it is what an Idempotency-Key is bound to.
func (r OrderRequest) Fingerprint() []byte {
	items := slices.Clone(r.Items)
	slices.SortFunc(items, func(a, b Item) int { return cmp.Compare(a.SKU, b.SKU) })
	canon := struct {
		CustomerID string      `json:"customer_id"`
		Items      []EventItem `json:"items"`
	}{CustomerID: r.CustomerID, Items: make([]EventItem, len(items))}
	for i, it := range items {
		canon.Items[i] = EventItem(it)
	}
	b, err := json.Marshal(canon)
	if err != nil { // strings and ints always marshal
		panic(fmt.Sprintf("orders: marshal canonical request: %v", err))
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// IdempotencyKey binds a create request to its first answer.
type IdempotencyKey struct {
	// Key is the client's Idempotency-Key header.
	Key string
	// Fingerprint is OrderRequest.Fingerprint of the request: the same key with another
	// fingerprint is refused (CodeIdempotencyReuse).
	Fingerprint []byte
}

// Response is an answer to a create request as stored with its idempotency key and replayed
// for every retry with that key.
type Response struct {
	Status int
	Body   []byte
}

// CreateOrderInput is everything the repository needs to create an order.
type CreateOrderInput struct {
	Request OrderRequest
	// Meta goes into the OrderCreated event's headers.
	Meta EventMeta
	// Idempotency is nil when the request had no Idempotency-Key.
	Idempotency *IdempotencyKey
	// Render turns the created order into the answer stored with the idempotency key; it runs
	// inside the transaction. Required when Idempotency is set.
	Render func(*Order) (Response, error)
}

// CreateOrderResult is the outcome of a create request.
type CreateOrderResult struct {
	// OrderID is the created order, or the order of the replayed answer.
	OrderID uuid.UUID
	// Order is the created order; nil when the answer is replayed.
	Order *Order
	// Response is the stored answer (Idempotency set): the one just stored, or, when Replayed,
	// the first request's.
	Response *Response
	// Replayed is true when an earlier request with the same Idempotency-Key created the order
	// and nothing was written now.
	Replayed bool
}

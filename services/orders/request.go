package orders

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/outboxshop/outboxshop/internal/input"
)

// Limits of a create-order request.
const (
	// MaxRequestBytes is the largest request body accepted (413 above).
	MaxRequestBytes = 64 << 10
	// MaxLines is the most lines an order may have.
	MaxLines = 50
	// MaxQuantity is the largest quantity of one line.
	MaxQuantity = 1000
	// MaxCustomerIDLength and MaxSKULength bound those strings, in characters.
	MaxCustomerIDLength = 255
	MaxSKULength        = 64
)

// OrderRequest is a valid request to create an order: DecodeOrderRequest returns only those.
// The SKUs are checked against the catalogue when the order is written.
type OrderRequest struct {
	CustomerID string
	Items      []Item
}

// Item is one requested line.
type Item struct {
	SKU      string
	Quantity int
}

// createOrderJSON is the wire form of the request body.
type createOrderJSON struct {
	CustomerID string     `json:"customer_id"`
	Items      []itemJSON `json:"items"`
}

type itemJSON struct {
	SKU string `json:"sku"`
	// Quantity is kept raw so that 2.5, 1e9 and 99999999999999999999 are answered as invalid
	// quantities (422) rather than as undecodable JSON.
	Quantity json.RawMessage `json:"quantity"`
}

// DecodeOrderRequest reads one JSON object from r under the input policy of
// internal/input and checks it against the rules of a new order. It is the only way the HTTP
// API turns a body into an OrderRequest.
//
// The errors are *Error values:
//   - CodeTooLarge when r is an http.MaxBytesReader whose limit was hit;
//   - CodeInvalid when the body is empty, not valid UTF-8, not JSON, not an object, has a
//     duplicate member, an unknown field or a field in another case ("Customer_ID"), a lone
//     UTF-16 surrogate escape, or anything after the object;
//   - CodeValidation, with one FieldError per broken rule, when a field has a value of the wrong
//     JSON type, the customer id is empty, longer than MaxCustomerIDLength or holds a
//     character no identifier may (input.IdentifierProblem: NUL, control and bidirectional
//     formatting characters), there are no items or more than MaxLines, a SKU is empty,
//     longer than MaxSKULength or holds such a character, a quantity is missing, not a whole
//     number, below 1 or above MaxQuantity, or two lines have the same SKU.
func DecodeOrderRequest(r io.Reader) (OrderRequest, error) {
	raw, err := io.ReadAll(r)
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return OrderRequest{}, Wrap(CodeTooLarge, err, fmt.Sprintf("The request body is larger than %d bytes.", tooLarge.Limit))
	}
	if err != nil {
		return OrderRequest{}, Wrap(CodeInvalid, err, "The request body could not be read.")
	}
	var body createOrderJSON
	if err := input.DecodeJSON(raw, &body, input.DecodeOptions{}); err != nil {
		return OrderRequest{}, FromInput(err)
	}
	return body.validate()
}

// validate checks the decoded body and returns the request, or CodeValidation with every broken
// rule.
func (b *createOrderJSON) validate() (OrderRequest, error) {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	switch n := utf8.RuneCountInString(b.CustomerID); {
	case strings.TrimSpace(b.CustomerID) == "":
		add("customer_id", "is required")
	case n > MaxCustomerIDLength:
		add("customer_id", "must be at most %d characters long", MaxCustomerIDLength)
	case input.IdentifierProblem(b.CustomerID) != "":
		add("customer_id", "%s", input.IdentifierProblem(b.CustomerID))
	}
	req := OrderRequest{CustomerID: b.CustomerID}
	switch {
	case len(b.Items) == 0:
		add("items", "must have at least one line")
	case len(b.Items) > MaxLines:
		add("items", "must have at most %d lines, not %d", MaxLines, len(b.Items))
	default:
		seen := make(map[string]int, len(b.Items))
		req.Items = make([]Item, 0, len(b.Items))
		for i, it := range b.Items {
			field := fmt.Sprintf("items[%d]", i)
			switch n := utf8.RuneCountInString(it.SKU); {
			case strings.TrimSpace(it.SKU) == "":
				add(field+".sku", "is required")
			case n > MaxSKULength:
				add(field+".sku", "must be at most %d characters long", MaxSKULength)
			case input.IdentifierProblem(it.SKU) != "":
				add(field+".sku", "%s", input.IdentifierProblem(it.SKU))
			default:
				if first, dup := seen[it.SKU]; dup {
					add(field+".sku", "%q is already on items[%d]: put the whole quantity on one line", it.SKU, first)
				} else {
					seen[it.SKU] = i
				}
			}
			qty, msg := parseQuantity(it.Quantity)
			if msg != "" {
				add(field+".quantity", "%s", msg)
			}
			req.Items = append(req.Items, Item{SKU: it.SKU, Quantity: qty})
		}
	}
	if len(errs) > 0 {
		return OrderRequest{}, &Error{Code: CodeValidation, Message: "The order is not valid; see errors.", Fields: errs}
	}
	return req, nil
}

// parseQuantity reads a raw JSON quantity. It returns a problem message when the value is not
// a whole number from 1 to MaxQuantity.
func parseQuantity(raw json.RawMessage) (int, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, "is required"
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, fmt.Sprintf("must be a whole number from 1 to %d", MaxQuantity)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		if raw[0] == '-' {
			return 0, "must be at least 1"
		}
		return 0, fmt.Sprintf("must be at most %d", MaxQuantity)
	case err != nil: // a fraction or an exponent
		return 0, fmt.Sprintf("must be a whole number from 1 to %d", MaxQuantity)
	case n < 1:
		return 0, "must be at least 1"
	case n > MaxQuantity:
		return 0, fmt.Sprintf("must be at most %d", MaxQuantity)
	}
	return int(n), ""
}

// Validate reports whether r satisfies the rules DecodeOrderRequest enforces. It returns nil
// for every request DecodeOrderRequest accepts (the fuzz test checks that).
func (r OrderRequest) Validate() error {
	var errs []error
	if strings.TrimSpace(r.CustomerID) == "" || utf8.RuneCountInString(r.CustomerID) > MaxCustomerIDLength ||
		input.IdentifierProblem(r.CustomerID) != "" {
		errs = append(errs, fmt.Errorf("customer_id %q", r.CustomerID))
	}
	if len(r.Items) == 0 || len(r.Items) > MaxLines {
		errs = append(errs, fmt.Errorf("%d items", len(r.Items)))
	}
	seen := map[string]bool{}
	for i, it := range r.Items {
		if strings.TrimSpace(it.SKU) == "" || utf8.RuneCountInString(it.SKU) > MaxSKULength || seen[it.SKU] ||
			input.IdentifierProblem(it.SKU) != "" {
			errs = append(errs, fmt.Errorf("items[%d].sku %q", i, it.SKU))
		}
		seen[it.SKU] = true
		if it.Quantity < 1 || it.Quantity > MaxQuantity {
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

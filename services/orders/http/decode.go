package http

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/outboxshop/outboxshop/internal/input"
	"github.com/outboxshop/outboxshop/services/orders"
)

// MaxRequestBytes is the largest create-order body accepted (413 above).
const MaxRequestBytes = 64 << 10

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
// internal/input and checks it against the rules of a new order (orders.OrderRequest). It
// is the only way the API turns a body into an OrderRequest.
//
// The errors are *orders.Error values:
//   - CodeTooLarge when r is an http.MaxBytesReader whose limit was hit;
//   - CodeInvalid when the body is empty, not valid UTF-8, not JSON, not an object, has a
//     duplicate member, an unknown field or a field in another case ("Customer_ID"), a lone
//     UTF-16 surrogate escape, or anything after the object;
//   - CodeValidation, with one FieldError per broken rule, when a field has a value of the
//     wrong JSON type, a quantity is not a whole number, or a value breaks a rule of the
//     domain (orders.CustomerIDProblem, LinesProblem, SKUProblem, QuantityProblem, two lines
//     with the same SKU).
func DecodeOrderRequest(r io.Reader) (orders.OrderRequest, error) {
	raw, err := io.ReadAll(r)
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return orders.OrderRequest{}, orders.Wrap(orders.CodeTooLarge, err, fmt.Sprintf("The request body is larger than %d bytes.", tooLarge.Limit))
	}
	if err != nil {
		return orders.OrderRequest{}, orders.Wrap(orders.CodeInvalid, err, "The request body could not be read.")
	}
	var body createOrderJSON
	if err := input.DecodeJSON(raw, &body, input.DecodeOptions{}); err != nil {
		return orders.OrderRequest{}, orders.FromInput(err)
	}
	return body.validate()
}

// validate checks the decoded body against the domain's rules and returns the request, or
// CodeValidation with every broken rule, by its JSON field name.
func (b *createOrderJSON) validate() (orders.OrderRequest, error) {
	var errs []orders.FieldError
	add := func(field, problem string) {
		if problem != "" {
			errs = append(errs, orders.FieldError{Field: field, Message: problem})
		}
	}
	add("customer_id", orders.CustomerIDProblem(b.CustomerID))
	req := orders.OrderRequest{CustomerID: b.CustomerID}
	if p := orders.LinesProblem(len(b.Items)); p != "" {
		add("items", p)
	} else {
		seen := make(map[string]int, len(b.Items))
		req.Items = make([]orders.Item, 0, len(b.Items))
		for i, it := range b.Items {
			field := fmt.Sprintf("items[%d]", i)
			if p := orders.SKUProblem(it.SKU); p != "" {
				add(field+".sku", p)
			} else if first, dup := seen[it.SKU]; dup {
				add(field+".sku", orders.DuplicateSKUProblem(it.SKU, first))
			} else {
				seen[it.SKU] = i
			}
			qty, p := parseQuantity(it.Quantity)
			add(field+".quantity", p)
			req.Items = append(req.Items, orders.Item{SKU: it.SKU, Quantity: qty})
		}
	}
	if len(errs) > 0 {
		return orders.OrderRequest{}, &orders.Error{Code: orders.CodeValidation, Message: "The order is not valid; see errors.", Fields: errs}
	}
	return req, nil
}

// parseQuantity reads a raw JSON quantity. It returns a problem when the value is missing,
// not a whole number, or breaks orders.QuantityProblem.
func parseQuantity(raw json.RawMessage) (int, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, "is required"
	}
	notWhole := fmt.Sprintf("must be a whole number from 1 to %d", orders.MaxQuantity)
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, notWhole
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		n = math.MaxInt64
		if raw[0] == '-' {
			n = math.MinInt64
		}
	case err != nil: // a fraction or an exponent
		return 0, notWhole
	}
	if p := orders.QuantityProblem(n); p != "" {
		return 0, p
	}
	return int(n), ""
}

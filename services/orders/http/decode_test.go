package http_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/orders"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
)

// lines returns n valid order lines as JSON.
func lines(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`{"sku":"SKU-%d","quantity":1}`, i)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func TestDecodeOrderRequest(t *testing.T) {
	t.Parallel()

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		req, err := ordershttp.DecodeOrderRequest(strings.NewReader(
			` {"customer_id": "c-42", "items": [{"sku": "BOOK-1", "quantity": 2}, {"sku": "MUG-1", "quantity": 1000}]} ` + "\n"))
		require.NoError(t, err)
		require.Equal(t, orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{
			{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 1000},
		}}, req)
		require.NoError(t, req.Validate())
	})

	t.Run("FiftyLines", func(t *testing.T) {
		t.Parallel()
		req, err := ordershttp.DecodeOrderRequest(strings.NewReader(`{"customer_id":"c","items":` + lines(orders.MaxLines) + `}`))
		require.NoError(t, err)
		require.Len(t, req.Items, orders.MaxLines)
	})

	cases := []struct {
		name   string
		body   string
		code   orders.Code
		fields []string // the field names of the errors, in order (CodeValidation only)
	}{
		{"Empty", ``, orders.CodeInvalid, nil},
		{"WhiteSpaceOnly", "  \n", orders.CodeInvalid, nil},
		{"NotJSON", `customer_id=c`, orders.CodeInvalid, nil},
		{"Truncated", `{"customer_id":"c","items":[`, orders.CodeInvalid, nil},
		{"Null", `null`, orders.CodeInvalid, nil},
		{"Array", `[]`, orders.CodeInvalid, nil},
		{"String", `"order"`, orders.CodeInvalid, nil},
		{"UnknownField", `{"customer_id":"c","items":[{"sku":"A","quantity":1}],"coupon":"x"}`, orders.CodeInvalid, nil},
		{"UnknownItemField", `{"customer_id":"c","items":[{"sku":"A","quantity":1,"price":3}]}`, orders.CodeInvalid, nil},
		{"TrailingObject", `{"customer_id":"c","items":[{"sku":"A","quantity":1}]}{}`, orders.CodeInvalid, nil},
		{"TrailingGarbage", `{"customer_id":"c","items":[{"sku":"A","quantity":1}]} x`, orders.CodeInvalid, nil},
		{"WrongCaseField", `{"Customer_ID":"c","items":[{"sku":"A","quantity":1}]}`, orders.CodeInvalid, nil},
		{"WrongCaseItemField", `{"customer_id":"c","items":[{"sku":"A","quantity":1},{"SKU":"B","quantity":1}]}`, orders.CodeInvalid, nil},
		{"CustomerIDNumber", `{"customer_id":42,"items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"ItemsObject", `{"customer_id":"c","items":{"sku":"A","quantity":1}}`, orders.CodeValidation, []string{"items"}},
		{"ItemNumber", `{"customer_id":"c","items":[1]}`, orders.CodeValidation, []string{"items[0]"}},
		{"SKUNumber", `{"customer_id":"c","items":[{"sku":1,"quantity":1}]}`, orders.CodeValidation, []string{"items[0].sku"}},
		// The input policy of internal/input (issue: both services accept the same).
		{"DuplicateKey", `{"customer_id":"c","customer_id":"d","items":[{"sku":"A","quantity":1}]}`, orders.CodeInvalid, nil},
		{"DuplicateItemKey", `{"customer_id":"c","items":[{"sku":"A","quantity":1,"quantity":2}]}`, orders.CodeInvalid, nil},
		{"InvalidUTF8", "{\"customer_id\":\"c\xff\xfe\",\"items\":[{\"sku\":\"A\",\"quantity\":1}]}", orders.CodeInvalid, nil},
		{"LoneSurrogate", `{"customer_id":"\ud800","items":[{"sku":"A","quantity":1}]}`, orders.CodeInvalid, nil},
		{"LoneLowSurrogateInSKU", `{"customer_id":"c","items":[{"sku":"A\udc00","quantity":1}]}`, orders.CodeInvalid, nil},
		{"NULCustomerID", `{"customer_id":"c\u0000","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"NULSKU", `{"customer_id":"c","items":[{"sku":"\u0000A","quantity":1}]}`, orders.CodeValidation, []string{"items[0].sku"}},
		{"ESCCustomerID", `{"customer_id":"\u001b[31mc","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"NewlineCustomerID", `{"customer_id":"c\nd","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"C1CustomerID", `{"customer_id":"c\u0085","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"BidiOverrideCustomerID", `{"customer_id":"c\u202egnp","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"BidiIsolateSKU", `{"customer_id":"c","items":[{"sku":"\u2066A","quantity":1}]}`, orders.CodeValidation, []string{"items[0].sku"}},
		{"DELSKU", "{\"customer_id\":\"c\",\"items\":[{\"sku\":\"A\x7f\",\"quantity\":1}]}", orders.CodeValidation, []string{"items[0].sku"}},
		{"EmptyCustomerID", `{"customer_id":"","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"BlankCustomerID", `{"customer_id":"  ","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"MissingCustomerID", `{"items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"LongCustomerID", `{"customer_id":"` + strings.Repeat("c", orders.MaxCustomerIDLength+1) + `","items":[{"sku":"A","quantity":1}]}`, orders.CodeValidation, []string{"customer_id"}},
		{"MissingItems", `{"customer_id":"c"}`, orders.CodeValidation, []string{"items"}},
		{"EmptyItems", `{"customer_id":"c","items":[]}`, orders.CodeValidation, []string{"items"}},
		{"NullItems", `{"customer_id":"c","items":null}`, orders.CodeValidation, []string{"items"}},
		{"TooManyLines", `{"customer_id":"c","items":` + lines(orders.MaxLines+1) + `}`, orders.CodeValidation, []string{"items"}},
		{"EmptySKU", `{"customer_id":"c","items":[{"sku":"","quantity":1}]}`, orders.CodeValidation, []string{"items[0].sku"}},
		{"LongSKU", `{"customer_id":"c","items":[{"sku":"` + strings.Repeat("S", orders.MaxSKULength+1) + `","quantity":1}]}`, orders.CodeValidation, []string{"items[0].sku"}},
		{"MissingQuantity", `{"customer_id":"c","items":[{"sku":"A"}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"NullQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":null}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"ZeroQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":0}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"NegativeQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":-3}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"AbsurdQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":1001}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"HugeQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":99999999999999999999999}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"HugeNegativeQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":-99999999999999999999999}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"FractionalQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":2.5}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"ExponentQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":1e2}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"StringQuantity", `{"customer_id":"c","items":[{"sku":"A","quantity":"2"}]}`, orders.CodeValidation, []string{"items[0].quantity"}},
		{"DuplicateSKU", `{"customer_id":"c","items":[{"sku":"A","quantity":1},{"sku":"B","quantity":1},{"sku":"A","quantity":2}]}`, orders.CodeValidation, []string{"items[2].sku"}},
		{"EveryRule", `{"customer_id":"","items":[{"sku":"","quantity":0},{"sku":"A","quantity":5000}]}`, orders.CodeValidation,
			[]string{"customer_id", "items[0].sku", "items[0].quantity", "items[1].quantity"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ordershttp.DecodeOrderRequest(strings.NewReader(tc.body))
			require.Error(t, err)
			require.Equal(t, tc.code, orders.ErrorCode(err), "error: %v", err)
			require.NotEmpty(t, orders.ErrorMessage(err))
			var fields []string
			for _, f := range orders.ErrorFields(err) {
				require.NotEmpty(t, f.Message)
				fields = append(fields, f.Field)
			}
			require.Equal(t, tc.fields, fields)
		})
	}

	t.Run("TooLarge", func(t *testing.T) {
		t.Parallel()
		for name, body := range map[string]string{
			"InTheObject":    `{"customer_id":"` + strings.Repeat("c", ordershttp.MaxRequestBytes) + `","items":[]}`,
			"AfterTheObject": `{"customer_id":"c","items":[{"sku":"A","quantity":1}]}` + strings.Repeat(" ", ordershttp.MaxRequestBytes),
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
				_, err := ordershttp.DecodeOrderRequest(http.MaxBytesReader(httptest.NewRecorder(), r.Body, ordershttp.MaxRequestBytes))
				require.Equal(t, orders.CodeTooLarge, orders.ErrorCode(err), "error: %v", err)
			})
		}
	})
}

func TestOrderRequestFingerprint(t *testing.T) {
	t.Parallel()
	decode := func(body string) orders.OrderRequest {
		t.Helper()
		req, err := ordershttp.DecodeOrderRequest(strings.NewReader(body))
		require.NoError(t, err)
		return req
	}
	a := decode(`{"customer_id":"c","items":[{"sku":"A","quantity":1},{"sku":"B","quantity":2}]}`)

	t.Run("SameRequestOtherSpelling", func(t *testing.T) {
		t.Parallel()
		b := decode(" {\n\"items\": [ {\"quantity\": 2, \"sku\": \"B\"}, {\"sku\": \"A\", \"quantity\": 1} ],\n \"customer_id\": \"c\" }")
		require.Equal(t, a.Fingerprint(), b.Fingerprint())
		require.Len(t, a.Fingerprint(), 32)
	})
	t.Run("OtherQuantity", func(t *testing.T) {
		t.Parallel()
		b := decode(`{"customer_id":"c","items":[{"sku":"A","quantity":1},{"sku":"B","quantity":3}]}`)
		require.NotEqual(t, a.Fingerprint(), b.Fingerprint())
	})
	t.Run("OtherCustomer", func(t *testing.T) {
		t.Parallel()
		b := decode(`{"customer_id":"d","items":[{"sku":"A","quantity":1},{"sku":"B","quantity":2}]}`)
		require.NotEqual(t, a.Fingerprint(), b.Fingerprint())
	})
}

// FuzzDecodeOrderRequest checks that no input makes the decoder panic, that every input it
// accepts is a valid order request, and that every refusal is an *orders.Error with a code
// the API maps to a 4xx answer. Its seed corpus runs with go test.
func FuzzDecodeOrderRequest(f *testing.F) {
	for _, seed := range []string{
		`{"customer_id":"c-42","items":[{"sku":"BOOK-1","quantity":2}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1},{"sku":"B","quantity":1000}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1},{"sku":"A","quantity":1}]}`,
		`{"customer_id":"","items":[]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":0}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1001}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1.5e3}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":-0}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":"1"}]}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1}],"x":1}`,
		`{"customer_id":"c","items":[{"sku":"A","quantity":1}]}{}`,
		`{"Customer_ID":"c","ITEMS":[{"SKU":"A","Quantity":1}]}`,
		`{"customer_id":"\u0000","items":[{"sku":"\ud800","quantity":1}]}`,
		`{"customer_id":"c\u0000","items":[{"sku":"A","quantity":1}]}`,
		`{"customer_id":"c","items":[{"sku":"\u0000","quantity":1}]}`,
		`{"customer_id":"\u001b[2J","items":[{"sku":"A","quantity":1}]}`,
		`{"customer_id":"c\u0085","items":[{"sku":"A","quantity":1}]}`,
		`{"customer_id":"\u202ec","items":[{"sku":"\u2066A","quantity":1}]}`,
		`{"customer_id":"\ud800","items":[{"sku":"A","quantity":1}]}`,
		`{"customer_id":"c\udc00\ud800","items":[{"sku":"A","quantity":1}]}`,
		"{\"customer_id\":\"k\xff\xfe\",\"items\":[{\"sku\":\"A\",\"quantity\":1}]}",
		`{"customer_id":"c","customer_id":"d","items":[{"sku":"A","quantity":1}]}`,
		`{"customer_id":"c","items":[{"sku":"A","SKU":"B","quantity":1}]}`,
		`{"customer_id":"c","items":` + lines(orders.MaxLines+1) + `}`,
		`null`, `[]`, `{}`, ``, `{`, `"`, `0`, `{"items":[null]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ordershttp.DecodeOrderRequest(bytes.NewReader(body))
		if err != nil {
			switch code := orders.ErrorCode(err); code {
			case orders.CodeInvalid, orders.CodeValidation:
			default:
				t.Fatalf("refused with code %q (%v), want malformed or invalid", code, err)
			}
			require.Equal(t, orders.OrderRequest{}, req)
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted an invalid request %+v: %v", req, err)
		}
		require.Len(t, req.Fingerprint(), 32)
	})
}

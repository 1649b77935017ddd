package warehouse_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/input"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

func nowUTC() time.Time { return time.Now().UTC() }

const orderID = "0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d"

func TestDecodeOrderCreated(t *testing.T) {
	t.Parallel()

	t.Run("decodes the contract's example and merges lines", func(t *testing.T) {
		t.Parallel()
		ev, err := warehouse.DecodeOrderCreated([]byte(`{"version": 1, "order_id": "` + orderID + `", "customer_id": "c-42",
			"items": [{"sku": "MUG-1", "quantity": 1}, {"sku": "BOOK-1", "quantity": 2}, {"sku": "MUG-1", "quantity": 2}],
			"created_at": "2026-11-29T10:00:00Z", "some_new_field": {"ignored": true}}`))
		require.NoError(t, err)
		require.Equal(t, uuid.MustParse(orderID), ev.OrderID)
		require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 3}}, ev.Items)
	})

	for _, tc := range []struct {
		name, body, contains string
	}{
		{"not JSON", `nope`, "not a JSON object"},
		{"a JSON array", `[1]`, "not a JSON object"},
		{"no version", `{"order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "no version"},
		{"version 2", `{"version": 2, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "unsupported event version 2"},
		{"version as string", `{"version": "1", "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "unsupported event version"},
		{"version null", `{"version": null, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "no version"},
		{"no order id", `{"version": 1, "items": [{"sku": "A", "quantity": 1}]}`, "no order_id"},
		{"order id not a UUID", `{"version": 1, "order_id": "o-1", "items": [{"sku": "A", "quantity": 1}]}`, "not a lowercase UUID"},
		{"order id in upper case", `{"version": 1, "order_id": "` + strings.ToUpper(orderID) + `", "items": [{"sku": "A", "quantity": 1}]}`, "not a lowercase UUID"},
		{"order id as a URN", `{"version": 1, "order_id": "urn:uuid:` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "not a lowercase UUID"},
		{"the nil order id", `{"version": 1, "order_id": "00000000-0000-0000-0000-000000000000", "items": [{"sku": "A", "quantity": 1}]}`, "nil UUID"},
		// The input policy of internal/input.
		{"a duplicate member", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}], "items": []}`, "more than once"},
		{"a field in another case", `{"version": 1, "Order_ID": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "case-sensitive"},
		{"invalid UTF-8", "{\"version\": 1, \"order_id\": \"" + orderID + "\", \"items\": [{\"sku\": \"A\xff\", \"quantity\": 1}]}", "UTF-8"},
		{"a lone surrogate", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A\ud800", "quantity": 1}]}`, "surrogate"},
		{"NUL in a SKU", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A\u0000", "quantity": 1}]}`, "NUL"},
		{"a control character in a SKU", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A\u001b", "quantity": 1}]}`, "control"},
		{"a bidi override in a SKU", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "\u202eA", "quantity": 1}]}`, "bidirectional"},
		{"a quantity as a string", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": "1"}]}`, "items[0].quantity must be an integer"},
		{"no items", `{"version": 1, "order_id": "` + orderID + `", "items": []}`, "1 to 1000 items"},
		{"zero quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 0}]}`, "quantity must be"},
		{"negative quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": -3}]}`, "quantity must be"},
		{"fractional quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1.5}]}`, "decode OrderCreated"},
		{"empty SKU", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "", "quantity": 1}]}`, "sku must have"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := warehouse.DecodeOrderCreated([]byte(tc.body))
			require.Error(t, err)
			require.Equal(t, warehouse.CodeInvalid, warehouse.ErrorCode(err))
			require.Contains(t, err.Error(), tc.contains)
		})
	}
}

func TestDecodeOrderCancelled(t *testing.T) {
	t.Parallel()

	t.Run("decodes the contract's example", func(t *testing.T) {
		t.Parallel()
		ev, err := warehouse.DecodeOrderCancelled([]byte(`{"version": 1, "order_id": "` + orderID + `", "cancelled_at": "2026-11-29T10:01:00Z"}`))
		require.NoError(t, err)
		require.Equal(t, uuid.MustParse(orderID), ev.OrderID)
	})
	t.Run("refuses version 2", func(t *testing.T) {
		t.Parallel()
		_, err := warehouse.DecodeOrderCancelled([]byte(`{"version": 2, "order_id": "` + orderID + `"}`))
		require.ErrorContains(t, err, "unsupported event version 2")
	})
	t.Run("refuses a missing order id", func(t *testing.T) {
		t.Parallel()
		_, err := warehouse.DecodeOrderCancelled([]byte(`{"version": 1}`))
		require.ErrorContains(t, err, "no order_id")
	})
}

func TestEventsJSON(t *testing.T) {
	t.Parallel()

	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	id := uuid.MustParse(orderID)
	for _, tc := range []struct {
		name string
		ev   any
		want string
	}{
		{"StockReserved", warehouse.NewStockReserved(id, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}}, at),
			`{"version":1,"order_id":"` + orderID + `","items":[{"sku":"BOOK-1","quantity":2}],"reserved_at":"2026-11-29T10:00:00Z"}`},
		{"StockRejected", warehouse.NewStockRejected(id, warehouse.ReasonInsufficientStock, []warehouse.Shortage{{SKU: "BOOK-1", Requested: 2, Available: 1}}, at),
			`{"version":1,"order_id":"` + orderID + `","reason":"insufficient_stock","shortages":[{"sku":"BOOK-1","requested":2,"available":1}],"rejected_at":"2026-11-29T10:00:00Z"}`},
		{"StockReleased", warehouse.NewStockReleased(id, nil, at),
			`{"version":1,"order_id":"` + orderID + `","items":[],"released_at":"2026-11-29T10:00:00Z"}`},
	} {
		t.Run(tc.name+" matches docs/events.md", func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tc.ev)
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(got))
		})
	}
}

// FuzzDecodeOrderCreated checks that no body makes the decoder panic, and that what it
// accepts satisfies the contract the rest of the warehouse relies on.
func FuzzDecodeOrderCreated(f *testing.F) {
	for _, seed := range []string{
		`{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "BOOK-1", "quantity": 2}]}`,
		`{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}, {"sku": "A", "quantity": 2147483647}]}`,
		`{"version": 2}`, `{"version": 1e0, "order_id": null}`, `[]`, `null`, ``, `{"items": {}}`,
		`{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A\u0000", "quantity": 1}]}`,
		`{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "\u202eA\u2066", "quantity": 1}]}`,
		`{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "\ud800", "quantity": 1}]}`,
		"{\"version\": 1, \"order_id\": \"" + orderID + "\", \"items\": [{\"sku\": \"k\xff\xfe\", \"quantity\": 1}]}",
		`{"version": 1, "version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`,
		`{"version": 1, "ORDER_ID": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`,
		`{"version": 1, "order_id": "urn:uuid:` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := warehouse.DecodeOrderCreated(body)
		if err != nil {
			require.Equal(t, warehouse.CodeInvalid, warehouse.ErrorCode(err))
			return
		}
		require.NotEqual(t, uuid.Nil, ev.OrderID)
		require.NotEmpty(t, ev.Items)
		for i, l := range ev.Items {
			require.Positive(t, l.Quantity)
			require.NotEmpty(t, l.SKU)
			require.Empty(t, input.IdentifierProblem(l.SKU), "a SKU PostgreSQL can store and a log shows as it is")
			if i > 0 {
				require.Less(t, ev.Items[i-1].SKU, l.SKU, "merged and sorted")
			}
		}
	})
}

func TestError(t *testing.T) {
	t.Parallel()

	t.Run("codes and messages see through wrapping", func(t *testing.T) {
		t.Parallel()
		err := warehouse.Errorf(warehouse.CodeNotFound, "SKU %q does not exist.", "X")
		wrapped := &wrapErr{err}
		require.Equal(t, warehouse.CodeNotFound, warehouse.ErrorCode(wrapped))
		require.Equal(t, `SKU "X" does not exist.`, warehouse.ErrorMessage(wrapped))
	})
	t.Run("other errors are internal and hide their text", func(t *testing.T) {
		t.Parallel()
		err := json.Unmarshal([]byte("{"), &struct{}{})
		require.Equal(t, warehouse.CodeInternal, warehouse.ErrorCode(err))
		require.NotContains(t, warehouse.ErrorMessage(err), "JSON")
		require.Equal(t, warehouse.Code(""), warehouse.ErrorCode(nil))
	})
}

type wrapErr struct{ err error }

func (w *wrapErr) Error() string { return "wrapped: " + w.err.Error() }
func (w *wrapErr) Unwrap() error { return w.err }

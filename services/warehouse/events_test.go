package warehouse_test

import (
	"encoding/json"
	"os"
	"path/filepath"
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

// orderCreatedV1Fixtures are version 1 OrderCreated bodies, each accepted or refused for the
// reason in want: every one is also decoded in its v2 form (asV2), with the same outcome, so
// that the v1 to v2 upgrade is checked on each.
var orderCreatedV1Fixtures = []struct {
	name, body string
	// want is a part of the refusal's message ("" for a body the warehouse accepts).
	want string
}{
	{"the contract's example with lines to merge and a field added later", `{"version": 1, "order_id": "` + orderID + `", "customer_id": "c-42",
		"items": [{"sku": "MUG-1", "quantity": 1}, {"sku": "BOOK-1", "quantity": 2}, {"sku": "MUG-1", "quantity": 2}],
		"created_at": "2026-11-29T10:00:00Z", "some_new_field": {"ignored": true}}`, ""},
	{"no customer", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 2147483647}]}`, ""},
	{"a version written 1.0", `{"version": 1.0, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "unsupported OrderCreated version"},
	{"version as string", `{"version": "1", "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, "unsupported OrderCreated version"},
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
	{"a quantity as a string", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": "1"}]}`, "quantity must be an integer"},
	{"no items", `{"version": 1, "order_id": "` + orderID + `", "items": []}`, "has 0"},
	{"items null", `{"version": 1, "order_id": "` + orderID + `", "items": null}`, "has 0"},
	{"zero quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 0}]}`, "quantity must be"},
	{"negative quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": -3}]}`, "quantity must be"},
	{"too large a quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 2147483648}]}`, "quantity must be"},
	{"fractional quantity", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1.5}]}`, "decode OrderCreated"},
	{"empty SKU", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "", "quantity": 1}]}`, "sku must have"},
	{"v2's lines in a v1 body", `{"version": 1, "order_id": "` + orderID + `", "lines": [{"sku": "A", "quantity": 1}]}`, "has 0"},
}

// asV2 writes a v1 fixture as its producer would have in version 2: the version, the
// customer nested, the items called lines. It works on the text, so that fixtures that are
// not valid JSON keep what makes them invalid.
func asV2(v1 string) string {
	return strings.NewReplacer(`"version": 1,`, `"version": 2,`, `"version": 1.0,`, `"version": 2.0,`,
		`"version": "1"`, `"version": "2"`, `"customer_id": "c-42"`, `"customer": {"id": "c-42"}`,
		`"items"`, `"lines"`, `"lines": [{"sku": "A", "quantity": 1}]}`, `"items": [{"sku": "A", "quantity": 1}]}`).Replace(v1)
}

func TestDecodeOrderCreated(t *testing.T) {
	t.Parallel()

	for _, tc := range orderCreatedV1Fixtures {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v1, err1 := warehouse.DecodeOrderCreated([]byte(tc.body), nil)
			v2body := asV2(tc.body)
			require.NotEqual(t, tc.body, v2body, "the fixture has a v2 form")
			v2, err2 := warehouse.DecodeOrderCreated([]byte(v2body), nil)
			if tc.want == "" {
				require.NoError(t, err1)
				require.NoError(t, err2, v2body)
				require.EqualValues(t, warehouse.OrderCreatedV1, v1.Version)
				require.EqualValues(t, warehouse.OrderCreatedV2, v2.Version)
				v1.Version = v2.Version
				require.Equal(t, v2, v1, "a v1 body is the same order as its v2 form")
				return
			}
			for _, err := range []error{err1, err2} {
				require.Error(t, err)
				require.Equal(t, warehouse.CodeInvalid, warehouse.ErrorCode(err))
				require.Contains(t, err.Error(), tc.want)
			}
			// The same refusal, in the words of each body's own fields.
			require.Equal(t, err1.Error(), strings.NewReplacer("lines", "items", "version 2.0", "version 1.0", `version "2"`, `version "1"`).Replace(err2.Error()),
				"a v1 body is refused as its v2 form is, naming its items as it does")
		})
	}

	t.Run("merges lines per SKU and sorts them", func(t *testing.T) {
		t.Parallel()
		ev, err := warehouse.DecodeOrderCreated([]byte(orderCreatedV1Fixtures[0].body), nil)
		require.NoError(t, err)
		require.Equal(t, uuid.MustParse(orderID), ev.OrderID)
		require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 3}}, ev.Lines)
	})
	for _, tc := range []struct {
		name, body string
		accepted   []int
		want       string
	}{
		{"no version", `{"order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, nil, "no version"},
		{"version null", `{"version": null, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, nil, "no version"},
		{"version 3", `{"version": 3, "order_id": "` + orderID + `", "lines": [{"sku": "A", "quantity": 1}]}`, nil,
			"unsupported OrderCreated version 3 (this warehouse reads versions 1 and 2)"},
		{"version 0", `{"version": 0, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, nil, "unsupported OrderCreated version 0"},
		{"v1's items in a v2 body", `{"version": 2, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, nil, "1 to 1000 lines, has 0"},
		{"a v1 body without items, in its words", `{"version": 1, "order_id": "` + orderID + `", "items": []}`, nil, "OrderCreated must have 1 to 1000 items, has 0"},
		{"v2 where only v1 is read", `{"version": 2, "order_id": "` + orderID + `", "lines": [{"sku": "A", "quantity": 1}]}`, []int{1},
			"unsupported OrderCreated version 2 (this warehouse reads version 1)"},
		{"v1 where only v2 is read", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, []int{2},
			"unsupported OrderCreated version 1 (this warehouse reads version 2)"},
		{"anything where nothing is read", `{"version": 1, "order_id": "` + orderID + `", "items": [{"sku": "A", "quantity": 1}]}`, []int{},
			"this warehouse reads no version"},
		{"not JSON", `nope`, nil, "not a JSON object"},
		{"a JSON array", `[1]`, nil, "not a JSON object"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := warehouse.DecodeOrderCreated([]byte(tc.body), tc.accepted)
			require.Error(t, err)
			require.Equal(t, warehouse.CodeInvalid, warehouse.ErrorCode(err))
			require.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("reads what docs/events.md shows of either version", func(t *testing.T) {
		t.Parallel()
		for version, file := range map[int]string{1: "OrderCreated.v1.json", 2: "OrderCreated.v2.json"} {
			body, err := os.ReadFile(filepath.Join("..", "..", "docs", "events", file))
			require.NoError(t, err)
			ev, err := warehouse.DecodeOrderCreated(body, nil)
			require.NoError(t, err, file)
			require.EqualValues(t, version, ev.Version)
			require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}}, ev.Lines, file)
		}
	})
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
		require.ErrorContains(t, err, "unsupported OrderCancelled version 2 (this warehouse reads version 1)")
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
		`{"version": 2}`, `{"version": 1e0, "order_id": null}`,
		`{"version": 2, "order_id": "` + orderID + `", "customer": {"id": "c-42"}, "lines": [{"sku": "BOOK-1", "quantity": 2}]}`,
		`{"version": 2, "order_id": "` + orderID + `", "lines": [{"sku": "B", "quantity": 1}], "items": [{"sku": "A", "quantity": 1}]}`, `[]`, `null`, ``, `{"items": {}}`,
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
		ev, err := warehouse.DecodeOrderCreated(body, nil)
		if err != nil {
			require.Equal(t, warehouse.CodeInvalid, warehouse.ErrorCode(err))
			return
		}
		require.NotEqual(t, uuid.Nil, ev.OrderID)
		require.NotEmpty(t, ev.Lines)
		for i, l := range ev.Lines {
			require.Positive(t, l.Quantity)
			require.NotEmpty(t, l.SKU)
			require.Empty(t, input.IdentifierProblem(l.SKU), "a SKU PostgreSQL can store and a log shows as it is")
			if i > 0 {
				require.Less(t, ev.Lines[i-1].SKU, l.SKU, "merged and sorted")
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

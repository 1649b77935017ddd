package orders_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/input"
	"github.com/outboxshop/outboxshop/services/orders"
)

const orderID = "0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d"

func TestDecodeStockEvent(t *testing.T) {
	t.Parallel()

	t.Run("decodes the contract's examples", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			typ, body string
			want      orders.StockEvent
		}{
			{orders.EventStockReserved, `{"version":1,"order_id":"` + orderID + `","items":[{"sku":"BOOK-1","quantity":2}],"reserved_at":"2026-11-29T10:00:00Z"}`,
				orders.StockEvent{Event: orders.EventStockReserved, OrderID: uuid.MustParse(orderID)}},
			{orders.EventStockRejected, `{"version":1,"order_id":"` + orderID + `","reason":"insufficient_stock","shortages":[{"sku":"BOOK-1","requested":2,"available":1}],"rejected_at":"2026-11-29T10:00:00Z"}`,
				orders.StockEvent{Event: orders.EventStockRejected, OrderID: uuid.MustParse(orderID), Reason: "insufficient_stock"}},
			// A field of a later release is ignored: adding one is not a new version.
			{orders.EventStockReleased, `{"version":1,"order_id":"` + orderID + `","items":[],"released_at":"2026-11-29T10:00:00Z","extra_field":"ignored"}`,
				orders.StockEvent{Event: orders.EventStockReleased, OrderID: uuid.MustParse(orderID)}},
		} {
			ev, err := orders.DecodeStockEvent(tc.typ, []byte(tc.body))
			require.NoError(t, err, tc.typ)
			require.Equal(t, tc.want, ev)
		}
	})

	for _, tc := range []struct {
		name, typ, body, contains string
	}{
		{"an unknown type", "StockCounted", `{"version":1,"order_id":"` + orderID + `"}`, `unknown event type "StockCounted"`},
		{"an event this service publishes", orders.EventOrderCreated, `{"version":1,"order_id":"` + orderID + `"}`, "unknown event type"},
		{"version 2", orders.EventStockReserved, `{"version":2,"order_id":"` + orderID + `"}`, "unsupported version 2 of StockReserved (want 1)"},
		{"no version", orders.EventStockReserved, `{"order_id":"` + orderID + `"}`, "unsupported version 0"},
		{"version as a string", orders.EventStockReleased, `{"version":"1"}`, "decode StockReleased"},
		{"not JSON", orders.EventStockReserved, `{"version":`, "decode StockReserved"},
		{"a JSON array", orders.EventStockReserved, `[1]`, "decode StockReserved"},
		{"order id not a UUID", orders.EventStockRejected, `{"version":1,"order_id":"nope"}`, `order_id "nope" is not a lowercase UUID`},
		{"no order id", orders.EventStockRejected, `{"version":1}`, `order_id "" is not a lowercase UUID`},
		{"order id in upper case", orders.EventStockReserved, `{"version":1,"order_id":"` + strings.ToUpper(orderID) + `"}`, "lowercase UUID"},
		// The input policy of internal/input.
		{"a duplicate member", orders.EventStockReserved, `{"version":1,"order_id":"` + orderID + `","order_id":"` + orderID + `"}`, "more than once"},
		{"a field in another case", orders.EventStockReserved, `{"version":1,"ORDER_ID":"` + orderID + `"}`, "case-sensitive"},
		{"invalid UTF-8", orders.EventStockRejected, "{\"version\":1,\"order_id\":\"" + orderID + "\",\"reason\":\"x\xff\"}", "UTF-8"},
		{"NUL in the reason", orders.EventStockRejected, `{"version":1,"order_id":"` + orderID + `","reason":"x\u0000"}`, "NUL"},
		{"a bidi override in the reason", orders.EventStockRejected, `{"version":1,"order_id":"` + orderID + `","reason":"x\u202e"}`, "bidirectional"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := orders.DecodeStockEvent(tc.typ, []byte(tc.body))
			require.ErrorContains(t, err, "not a stock event: ")
			require.ErrorContains(t, err, tc.contains)
		})
	}
}

// FuzzDecodeStockEvent checks that no body makes the decoder panic, and that what it accepts
// satisfies the contract the store relies on.
func FuzzDecodeStockEvent(f *testing.F) {
	for _, seed := range []string{
		`{"version":1,"order_id":"` + orderID + `"}`,
		`{"version":1,"order_id":"` + orderID + `","reason":"insufficient_stock","shortages":[]}`,
		`{"version":2}`, `{"version":1e0,"order_id":null}`, `[]`, `null`, ``,
		`{"version":1,"order_id":"` + orderID + `","reason":"\u202ex\u2066"}`,
		`{"version":1,"order_id":"` + orderID + `","reason":"\ud800"}`,
		`{"version":1,"version":1,"order_id":"` + orderID + `"}`,
		`{"version":1,"order_id":"urn:uuid:` + orderID + `"}`,
	} {
		f.Add(orders.EventStockRejected, []byte(seed))
	}
	f.Add("StockCounted", []byte(`{"version":1,"order_id":"`+orderID+`"}`))
	f.Fuzz(func(t *testing.T, typ string, body []byte) {
		ev, err := orders.DecodeStockEvent(typ, body)
		if err != nil {
			require.ErrorContains(t, err, "not a stock event: ")
			return
		}
		require.Contains(t, []string{orders.EventStockReserved, orders.EventStockRejected, orders.EventStockReleased}, ev.Event)
		require.Equal(t, typ, ev.Event)
		require.Empty(t, input.IdentifierProblem(ev.Reason), "a reason PostgreSQL can store and a log shows as it is")
	})
}

// TestNewOrderCreated checks that each version of OrderCreated is written as docs/events.md
// shows it (docs/events/OrderCreated.v*.json, which the warehouse's tests decode).
func TestNewOrderCreated(t *testing.T) {
	t.Parallel()
	o := orders.Order{
		ID: uuid.MustParse(orderID), CustomerID: "c-42", Lines: []orders.Line{{SKU: "BOOK-1", Quantity: 2}},
		CreatedAt: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
	}
	for _, v := range orders.OrderCreatedVersions() {
		body, err := orders.NewOrderCreated(v, o)
		require.NoError(t, err)
		got, err := json.Marshal(body)
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join("..", "..", "docs", "events", fmt.Sprintf("OrderCreated.v%d.json", v)))
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(got), "version %d", v)
	}
	for _, v := range []int{0, 3} {
		_, err := orders.NewOrderCreated(v, o)
		require.ErrorContains(t, err, fmt.Sprintf("OrderCreated has no version %d", v))
	}
}

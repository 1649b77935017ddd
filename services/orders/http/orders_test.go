package http_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/services/orders"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
)

const validBody = `{"customer_id": "c-42", "items": [{"sku": "BOOK-1", "quantity": 2}, {"sku": "MUG-1", "quantity": 1}]}`

// itemsJSON returns n order lines as JSON, all with known SKUs when n <= 5.
func itemsJSON(n int, qty int) string {
	skus := []string{"BOOK-1", "MUG-1", "TEE-1", "PEN-1", "BAG-1"}
	parts := make([]string, n)
	for i := range parts {
		sku := fmt.Sprintf("SKU-%d", i)
		if i < len(skus) {
			sku = skus[i]
		}
		parts[i] = fmt.Sprintf(`{"sku":%q,"quantity":%d}`, sku, qty)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestBadInput sends every kind of bad request to the real router and database, and checks
// the status, the problem document and that nothing was written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknownID := uuid.Must(uuid.NewV7()).String()
	cases := []badInput{{name: "MalformedJSON", body: `{"customer_id": "c-42", "items": [`, status: 400, typ: "malformed-body"},
		{name: "NotJSON", body: `customer_id=c-42`, status: 400, typ: "malformed-body"},
		{name: "EmptyBody", body: ``, status: 400, typ: "malformed-body"},
		{name: "JSONNull", body: `null`, status: 400, typ: "malformed-body"},
		{name: "JSONArray", body: `[` + validBody + `]`, status: 400, typ: "malformed-body"},
		{name: "UnknownField", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1}],"discount":50}`, status: 400, typ: "malformed-body"},
		{name: "UnknownItemField", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1,"price":0}]}`, status: 400, typ: "malformed-body"},
		{name: "WrongCaseField", body: `{"CUSTOMER_ID":"c","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 400, typ: "malformed-body"},
		{name: "TrailingData", body: validBody + `{"customer_id":"c"}`, status: 400, typ: "malformed-body"},
		{name: "WrongFieldType", body: `{"customer_id":42,"items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		// The input policy both services share (internal/input, internal/httpapi).
		{name: "NULCustomerID", body: `{"customer_id":"c\u0000","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "NULSKU", body: `{"customer_id":"c","items":[{"sku":"BOOK-1\u0000","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"items[0].sku"}},
		{name: "NULSKUWithKey", body: `{"customer_id":"c","items":[{"sku":"\u0000","quantity":1}]}`, headers: []string{"Idempotency-Key: k-nul"}, status: 422, typ: "validation", fields: []string{"items[0].sku"}},
		{name: "ESCCustomerID", body: `{"customer_id":"\u001b[31mc","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "C1CustomerID", body: `{"customer_id":"c\u009b","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "BidiOverrideCustomerID", body: `{"customer_id":"c\u202egnp.exe","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "BidiIsolateSKU", body: `{"customer_id":"c","items":[{"sku":"\u2067BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"items[0].sku"}},
		{name: "LoneSurrogate", body: `{"customer_id":"\ud800","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 400, typ: "malformed-body"},
		{name: "LoneLowSurrogate", body: `{"customer_id":"c\udfff","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 400, typ: "malformed-body"},
		{name: "InvalidUTF8Body", body: "{\"customer_id\":\"c\xff\xfe\",\"items\":[{\"sku\":\"BOOK-1\",\"quantity\":1}]}", status: 400, typ: "malformed-body"},
		{name: "Latin1Body", body: "{\"customer_id\":\"caf\xe9\",\"items\":[{\"sku\":\"BOOK-1\",\"quantity\":1}]}", status: 400, typ: "malformed-body"},
		{name: "DuplicateKey", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1}],"customer_id":"d"}`, status: 400, typ: "malformed-body"},
		{name: "DuplicateItemKey", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","sku":"MUG-1","quantity":1}]}`, status: 400, typ: "malformed-body"},
		{name: "WrongCaseItemField", body: `{"customer_id":"c","items":[{"Sku":"BOOK-1","quantity":1}]}`, status: 400, typ: "malformed-body"},
		{name: "CharsetLatin1", body: validBody, headers: []string{"Content-Type: application/json; charset=latin1"}, status: 415, typ: "unsupported-media-type"},
		{name: "CharsetUTF16", body: validBody, headers: []string{"Content-Type: application/json; charset=utf-16"}, status: 415, typ: "unsupported-media-type"},
		{name: "IdempotencyKeyInvalidUTF8", body: validBody, headers: []string{"Idempotency-Key: k\xff\xfe"}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeyNonASCII", body: validBody, headers: []string{"Idempotency-Key: clé"}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeySpace", body: validBody, headers: []string{"Idempotency-Key: a b"}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeyControl", body: validBody, headers: []string{"Idempotency-Key: a\tb"}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeyTooManyBytes", body: validBody, headers: []string{"Idempotency-Key: " + strings.Repeat("é", 128)}, status: 400, typ: "invalid-header"},
		{name: "GetURNUUID", method: http.MethodGet, path: "/orders/urn:uuid:" + unknownID, status: 404, typ: "not-found"},
		{name: "GetUppercaseUUID", method: http.MethodGet, path: "/orders/" + strings.ToUpper(unknownID), status: 404, typ: "not-found"},
		{name: "GetHexUUID", method: http.MethodGet, path: "/orders/" + strings.ReplaceAll(unknownID, "-", ""), status: 404, typ: "not-found"},
		{name: "GetBracedUUID", method: http.MethodGet, path: "/orders/%7B" + unknownID + "%7D", status: 404, typ: "not-found"},
		{name: "CancelURNUUID", method: http.MethodPost, path: "/orders/urn:uuid:" + unknownID + "/cancel", status: 404, typ: "not-found"},
		{name: "CancelHexUUID", method: http.MethodPost, path: "/orders/" + strings.ReplaceAll(unknownID, "-", "") + "/cancel", status: 404, typ: "not-found"},
		{name: "PutOrder", method: http.MethodPut, path: "/orders/" + unknownID, status: 405, typ: "method-not-allowed", allow: []string{"GET", "HEAD"}},
		{name: "GetCancel", method: http.MethodGet, path: "/orders/" + unknownID + "/cancel", status: 405, typ: "method-not-allowed", allow: []string{"POST"}},
		{name: "DeleteOrders", method: http.MethodDelete, path: "/orders", status: 405, typ: "method-not-allowed", allow: []string{"POST"}},
		{name: "EmptyCustomerID", body: `{"customer_id":"","items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "MissingCustomerID", body: `{"items":[{"sku":"BOOK-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"customer_id"}},
		{name: "EmptyItems", body: `{"customer_id":"c","items":[]}`, status: 422, typ: "validation", fields: []string{"items"}},
		{name: "MissingItems", body: `{"customer_id":"c"}`, status: 422, typ: "validation", fields: []string{"items"}},
		{name: "ZeroQuantity", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":0}]}`, status: 422, typ: "validation", fields: []string{"items[0].quantity"}},
		{name: "NegativeQuantity", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":-1}]}`, status: 422, typ: "validation", fields: []string{"items[0].quantity"}},
		{name: "AbsurdQuantity", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1001}]}`, status: 422, typ: "validation", fields: []string{"items[0].quantity"}},
		{name: "OverflowingQuantity", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":18446744073709551616}]}`, status: 422, typ: "validation", fields: []string{"items[0].quantity"}},
		{name: "FractionalQuantity", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1.5}]}`, status: 422, typ: "validation", fields: []string{"items[0].quantity"}},
		{name: "TooManyLines", body: `{"customer_id":"c","items":` + itemsJSON(orders.MaxLines+1, 1) + `}`, status: 422, typ: "validation", fields: []string{"items"}},
		{name: "DuplicateSKU", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1},{"sku":"BOOK-1","quantity":2}]}`, status: 422, typ: "validation", fields: []string{"items[1].sku"}},
		{name: "UnknownSKU", body: `{"customer_id":"c","items":[{"sku":"BOOK-1","quantity":1},{"sku":"CAR-1","quantity":1}]}`, status: 422, typ: "validation", fields: []string{"items[1].sku"}},
		{name: "UnknownSKUWithKey", body: `{"customer_id":"c","items":[{"sku":"CAR-1","quantity":1}]}`, headers: []string{"Idempotency-Key: k-unknown"}, status: 422, typ: "validation", fields: []string{"items[0].sku"}},
		{name: "BodyTooLarge", body: `{"customer_id":"` + strings.Repeat("c", ordershttp.MaxRequestBytes) + `","items":[]}`, status: 413, typ: "body-too-large"},
		{name: "BodyTooLargeChunked", body: `{"customer_id":"` + strings.Repeat("c", ordershttp.MaxRequestBytes) + `","items":[]}`, chunked: true, status: 413, typ: "body-too-large"},
		{name: "BodyTooLargeAfterObject", body: validBody + strings.Repeat(" ", ordershttp.MaxRequestBytes), status: 413, typ: "body-too-large"},
		{name: "WrongContentType", body: validBody, headers: []string{"Content-Type: text/plain"}, status: 415, typ: "unsupported-media-type"},
		{name: "FormContentType", body: validBody, headers: []string{"Content-Type: application/x-www-form-urlencoded"}, status: 415, typ: "unsupported-media-type"},
		{name: "NoContentType", body: validBody, headers: []string{"Content-Type:"}, status: 415, typ: "unsupported-media-type"},
		{name: "IdempotencyKeyTooLong", body: validBody, headers: []string{"Idempotency-Key: " + strings.Repeat("k", 256)}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeyEmpty", body: validBody, headers: []string{"Idempotency-Key:"}, status: 400, typ: "invalid-header"},
		{name: "IdempotencyKeyTwice", body: validBody, headers: []string{"Idempotency-Key: a", "Idempotency-Key: b"}, status: 400, typ: "invalid-header"},
		{name: "GetNonUUID", method: http.MethodGet, path: "/orders/not-a-uuid", status: 404, typ: "not-found"},
		{name: "GetUnknown", method: http.MethodGet, path: "/orders/" + unknownID, status: 404, typ: "not-found"},
		{name: "CancelNonUUID", method: http.MethodPost, path: "/orders/42/cancel", status: 404, typ: "not-found"},
		{name: "CancelUnknown", method: http.MethodPost, path: "/orders/" + unknownID + "/cancel", status: 404, typ: "not-found"},
		{name: "UnknownPath", method: http.MethodGet, path: "/nothing", status: 404, typ: "not-found"},
		{name: "WrongMethod", method: http.MethodDelete, path: "/orders/" + unknownID, status: 405, typ: "method-not-allowed", allow: []string{"GET", "HEAD"}},
	}
	t.Run("Cases", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.check(t, b)
			})
		}
	})
	// Bad input is the client's mistake: it is never logged as an error, so it never pages
	// anyone.
	require.Empty(t, b.logs.levels(t, "ERROR"), "bad input logged as an error")
}

// badInput is a bad request and how it must be answered.
type badInput struct {
	name    string
	method  string
	path    string
	body    string
	headers []string
	chunked bool // send the body without a Content-Length
	status  int
	typ     string   // the end of the problem type
	fields  []string // the problem's errors, by field (422 only)
	allow   []string // the Allow header (405 only)
}

// check sends the request and checks the answer, and that nothing was written.
func (tc badInput) check(t *testing.T, b *bundle) {
	t.Helper()
	method, path := tc.method, tc.path
	if method == "" {
		method, path = http.MethodPost, "/orders"
	}
	headers := tc.headers
	if method == http.MethodPost && path == "/orders" && !strings.HasPrefix(strings.Join(headers, "\n"), "Content-Type") {
		headers = append([]string{jsonCT}, headers...)
	}
	var resp response
	if tc.chunked {
		resp = b.doChunked(t, method, path, tc.body, headers...)
	} else {
		resp = b.do(t, method, path, tc.body, headers...)
	}
	require.Equal(t, tc.status, resp.StatusCode, "body: %s", resp.body)
	d := resp.problem(t)
	require.True(t, strings.HasSuffix(d.Type, ":"+tc.typ), "type %q", d.Type)
	require.NotEmpty(t, d.Detail)
	var fields []string
	for _, e := range d.Errors {
		require.NotEmpty(t, e.Message)
		fields = append(fields, e.Field)
	}
	require.Equal(t, tc.fields, fields)
	require.NotEmpty(t, resp.Header.Get("X-Request-ID"))
	require.Equal(t, tc.allow, resp.Header.Values("Allow"))
	for _, table := range []string{"orders", "order_lines", "order_status_history", "outbox_messages", "idempotency_keys"} {
		require.Zero(t, b.count(t, table), "%s written by a refused request", table)
	}
}

func TestCreateOrder(t *testing.T) {
	t.Parallel()

	t.Run("Created", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		resp := b.post(t, validBody, "X-Request-ID: req-create-1", "Traceparent: "+tp)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", resp.body)
		o := resp.order(t)
		id, err := uuid.Parse(o.ID)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), id.Version(), "order ids are UUIDv7")
		require.Equal(t, "/orders/"+o.ID, resp.Header.Get("Location"))
		require.Equal(t, "req-create-1", resp.Header.Get("X-Request-ID"))
		require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
		require.Equal(t, "c-42", o.CustomerID)
		require.Equal(t, "PENDING", o.Status)
		require.Len(t, o.Items, 2)
		require.Equal(t, "BOOK-1", o.Items[0].SKU)
		require.Equal(t, "The Go Programming Language", o.Items[0].Name)
		require.Equal(t, 2, o.Items[0].Quantity)
		require.Len(t, o.History, 1)
		require.Equal(t, "PENDING", o.History[0].Status)
		require.Equal(t, "OrderCreated", o.History[0].Event)
		require.Equal(t, 1, b.commits.get(), "AfterCommit runs once per created order")

		var typ, corr, trace string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT type, headers->>'correlation_id', headers->>'traceparent' FROM outbox_messages WHERE aggregate_id = $1`, o.ID,
		).Scan(&typ, &corr, &trace))
		require.Equal(t, "OrderCreated", typ)
		require.Equal(t, "req-create-1", corr, "the request id is the events' correlation id")
		require.Equal(t, tp, trace)

		get := b.do(t, http.MethodGet, "/orders/"+o.ID, "")
		require.Equal(t, http.StatusOK, get.StatusCode)
		require.Equal(t, resp.body, get.body, "GET answers what POST answered")
	})

	t.Run("ContentTypeWithCharset", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		resp := b.do(t, http.MethodPost, "/orders", validBody, "Content-Type: application/json; charset=utf-8")
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", resp.body)
	})

	t.Run("LimitsAreInclusive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		resp := b.post(t, `{"customer_id":"c","items":`+itemsJSON(5, orders.MaxQuantity)+`}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", resp.body)
		require.Len(t, resp.order(t).Items, 5)
	})

	t.Run("GeneratedRequestID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, header := range []string{"", "X-Request-ID: " + strings.Repeat("r", 129), "X-Request-ID: has space"} {
			var headers []string
			if header != "" {
				headers = append(headers, header)
			}
			resp := b.post(t, validBody, headers...)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			id := resp.Header.Get("X-Request-ID")
			_, err := uuid.Parse(id)
			require.NoError(t, err, "a missing or unusable X-Request-ID is replaced by a generated one, got %q", id)
			var corr string
			require.NoError(t, b.pool.QueryRow(context.Background(),
				`SELECT headers->>'correlation_id' FROM outbox_messages WHERE aggregate_id = $1`, resp.order(t).ID).Scan(&corr))
			require.Equal(t, id, corr)
		}
	})

	t.Run("AccessLog", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		resp := b.post(t, validBody, "X-Request-ID: req-log")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		o := resp.order(t)
		get := b.do(t, http.MethodGet, "/orders/"+o.ID, "", "X-Request-ID: req-log-get")
		require.Equal(t, http.StatusOK, get.StatusCode)

		lines := b.logs.lines(t, "http request")
		require.Len(t, lines, 2)
		require.Equal(t, "POST", lines[0]["method"])
		require.Equal(t, "/orders", lines[0]["route"])
		require.Equal(t, float64(201), lines[0]["status"])
		require.Equal(t, "req-log", lines[0]["request_id"])
		require.Contains(t, lines[0], "duration")
		require.Equal(t, "GET", lines[1]["method"])
		require.Equal(t, "/orders/{id}", lines[1]["route"], "the route pattern, not the path")
		require.Equal(t, "req-log-get", lines[1]["request_id"])
		require.Equal(t, o.ID, lines[1]["order_id"])

		created := b.logs.lines(t, "order created")
		require.Len(t, created, 1)
		require.Equal(t, o.ID, created[0]["order_id"])
	})
}

func TestIdempotency(t *testing.T) {
	t.Parallel()

	t.Run("SameKeyTwice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.post(t, validBody, "Idempotency-Key: key-1")
		require.Equal(t, http.StatusCreated, first.StatusCode, "body: %s", first.body)
		// The same request, spelled differently (key order, white space, line order).
		second := b.post(t, `{"items":[{"quantity":1,"sku":"MUG-1"},{"sku":"BOOK-1","quantity":2}],
			"customer_id":"c-42"}`, "Idempotency-Key: key-1")
		require.Equal(t, http.StatusCreated, second.StatusCode, "body: %s", second.body)
		require.Equal(t, first.body, second.body, "the replay is the first answer, byte for byte")
		require.Equal(t, first.Header.Get("Location"), second.Header.Get("Location"))
		require.Empty(t, first.Header.Get("Idempotent-Replayed"))
		require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
		require.Equal(t, 1, b.count(t, "orders"))
		require.Equal(t, 1, b.count(t, "outbox_messages"))
		require.Equal(t, 1, b.count(t, "idempotency_keys"))
		require.Equal(t, 1, b.commits.get())

		// The stored answer does not follow the order: it is the first answer.
		_, err := b.pool.Exec(context.Background(), `UPDATE orders SET status = 'RESERVED'`)
		require.NoError(t, err)
		third := b.post(t, validBody, "Idempotency-Key: key-1")
		require.Equal(t, first.body, third.body)
	})

	t.Run("SameKeyDifferentBody", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.post(t, validBody, "Idempotency-Key: key-2")
		require.Equal(t, http.StatusCreated, first.StatusCode)
		for name, body := range map[string]string{
			"OtherQuantity": `{"customer_id": "c-42", "items": [{"sku": "BOOK-1", "quantity": 3}, {"sku": "MUG-1", "quantity": 1}]}`,
			"OtherCustomer": `{"customer_id": "c-43", "items": [{"sku": "BOOK-1", "quantity": 2}, {"sku": "MUG-1", "quantity": 1}]}`,
			"FewerLines":    `{"customer_id": "c-42", "items": [{"sku": "BOOK-1", "quantity": 2}]}`,
		} {
			t.Run(name, func(t *testing.T) {
				resp := b.post(t, body, "Idempotency-Key: key-2")
				require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "body: %s", resp.body)
				d := resp.problem(t)
				require.Contains(t, d.Type, "idempotency-key-reuse")
				require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
			})
		}
		require.Equal(t, 1, b.count(t, "orders"))
		require.Equal(t, 1, b.count(t, "outbox_messages"))
	})

	t.Run("TwentyConcurrentRetries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 20
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			resps = make([]response, n)
		)
		for i := range n {
			wg.Go(func() {
				<-start
				resps[i] = b.post(t, validBody, "Idempotency-Key: key-concurrent")
			})
		}
		close(start)
		wg.Wait()
		replayed := 0
		for i, r := range resps {
			require.Equal(t, http.StatusCreated, r.StatusCode, "request %d: %s", i, r.body)
			require.Equal(t, resps[0].body, r.body, "request %d", i)
			if r.Header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed, "one request created the order, the others replayed it")
		require.Equal(t, 1, b.count(t, "orders"))
		require.Equal(t, 1, b.count(t, "order_status_history"))
		require.Equal(t, 1, b.count(t, "outbox_messages"))
		require.Equal(t, 1, b.count(t, "idempotency_keys"))
	})

	t.Run("DifferentKeysOrNoKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, headers := range [][]string{{"Idempotency-Key: a"}, {"Idempotency-Key: b"}, nil, nil} {
			resp := b.post(t, validBody, headers...)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
		}
		require.Equal(t, 4, b.count(t, "orders"))
		require.Equal(t, 4, b.count(t, "outbox_messages"))
		require.Equal(t, 2, b.count(t, "idempotency_keys"))
	})

	t.Run("LongestKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := "Idempotency-Key: " + strings.Repeat("k", orders.MaxIdempotencyKeyLength)
		require.Equal(t, http.StatusCreated, b.post(t, validBody, key).StatusCode)
		require.Equal(t, "true", b.post(t, validBody, key).Header.Get("Idempotent-Replayed"))
	})
}

// stockEvent applies a stock event to an order as the consumer would.
func (b *bundle) stockEvent(t *testing.T, id string, event, reason, messageID string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		out, err := b.store.ApplyStockUpdate(ctx, tx, orders.StockUpdate{
			Event: event, OrderID: uuid.MustParse(id), Reason: reason, MessageID: messageID,
		})
		if err == nil && !out.Applied {
			err = fmt.Errorf("%s not applied to %s order", event, out.From)
		}
		return err
	}))
}

func TestCancelOrder(t *testing.T) {
	t.Parallel()

	created := func(t *testing.T, b *bundle) string {
		t.Helper()
		resp := b.post(t, validBody)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		return resp.order(t).ID
	}
	cancel := func(t *testing.T, b *bundle, id string) response {
		t.Helper()
		return b.do(t, http.MethodPost, "/orders/"+id+"/cancel", "", "X-Request-ID: req-cancel")
	}
	events := func(t *testing.T, b *bundle, id string) []string {
		t.Helper()
		rows, err := b.pool.Query(context.Background(), `SELECT type FROM outbox_messages WHERE aggregate_id = $1 ORDER BY seq`, id)
		require.NoError(t, err)
		types, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return types
	}

	t.Run("Pending", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := created(t, b)
		resp := cancel(t, b, id)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", resp.body)
		o := resp.order(t)
		require.Equal(t, "CANCELLING", o.Status)
		require.Len(t, o.History, 2)
		require.Equal(t, "PENDING", o.History[1].From)
		require.Equal(t, "CANCELLING", o.History[1].Status)
		require.Equal(t, "OrderCancelled", o.History[1].Event)
		require.Equal(t, []string{"OrderCreated", "OrderCancelled"}, events(t, b, id))
		var corr string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT headers->>'correlation_id' FROM outbox_messages WHERE type = 'OrderCancelled'`).Scan(&corr))
		require.Equal(t, "req-cancel", corr)

		again := cancel(t, b, id)
		require.Equal(t, http.StatusOK, again.StatusCode, "cancelling is idempotent")
		require.Equal(t, "CANCELLING", again.order(t).Status)
		require.Equal(t, []string{"OrderCreated", "OrderCancelled"}, events(t, b, id), "no second event")
	})

	t.Run("Reserved", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := created(t, b)
		b.stockEvent(t, id, orders.EventStockReserved, "", "m-1")
		resp := cancel(t, b, id)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "CANCELLING", resp.order(t).Status)
		require.Equal(t, []string{"OrderCreated", "OrderCancelled"}, events(t, b, id))
	})

	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := created(t, b)
		require.Equal(t, http.StatusOK, cancel(t, b, id).StatusCode)
		b.stockEvent(t, id, orders.EventStockReleased, "", "m-2")
		resp := cancel(t, b, id)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "CANCELLED", resp.order(t).Status)
		require.Equal(t, []string{"OrderCreated", "OrderCancelled"}, events(t, b, id))
	})

	t.Run("Rejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := created(t, b)
		b.stockEvent(t, id, orders.EventStockRejected, "insufficient_stock", "m-3")
		resp := cancel(t, b, id)
		require.Equal(t, http.StatusConflict, resp.StatusCode)
		require.Contains(t, resp.problem(t).Detail, "REJECTED")
		require.Equal(t, []string{"OrderCreated"}, events(t, b, id))
		get := b.do(t, http.MethodGet, "/orders/"+id, "")
		require.Equal(t, "REJECTED", get.order(t).Status)
	})
}

func TestGetOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.post(t, validBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	id := resp.order(t).ID
	b.stockEvent(t, id, orders.EventStockReserved, "", "msg-reserved")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/orders/"+id+"/cancel", "").StatusCode)
	b.stockEvent(t, id, orders.EventStockReleased, "", "msg-released")

	for _, path := range []string{"/orders/" + id} {
		get := b.do(t, http.MethodGet, path, "")
		require.Equal(t, http.StatusOK, get.StatusCode)
		o := get.order(t)
		require.Equal(t, id, o.ID)
		require.Equal(t, "CANCELLED", o.Status)
		require.Len(t, o.Items, 2)
		created, err := time.Parse(time.RFC3339Nano, o.CreatedAt)
		require.NoError(t, err)
		updated, err := time.Parse(time.RFC3339Nano, o.UpdatedAt)
		require.NoError(t, err)
		require.True(t, updated.After(created), "updated_at moves with the status")

		type step struct{ from, to, event, messageID string }
		var steps []step
		var last time.Time
		for _, h := range o.History {
			steps = append(steps, step{h.From, h.Status, h.Event, h.MessageID})
			at, err := time.Parse(time.RFC3339Nano, h.At)
			require.NoError(t, err)
			require.False(t, at.Before(last), "history is oldest first")
			last = at
		}
		require.Equal(t, []step{
			{"", "PENDING", "OrderCreated", ""},
			{"PENDING", "RESERVED", "StockReserved", "msg-reserved"},
			{"RESERVED", "CANCELLING", "OrderCancelled", ""},
			{"CANCELLING", "CANCELLED", "StockReleased", "msg-released"},
		}, steps)
	}
}

func TestOps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	health := b.do(t, http.MethodGet, "/healthz", "")
	require.Equal(t, http.StatusOK, health.StatusCode)
	require.JSONEq(t, `{"status":"ok"}`, string(health.body))
	ready := b.do(t, http.MethodGet, "/readyz", "")
	require.Equal(t, http.StatusOK, ready.StatusCode)
	require.JSONEq(t, `{"status":"ready","checks":{"database":"up"}}`, string(ready.body))
	metrics := b.do(t, http.MethodGet, "/metrics", "")
	require.Equal(t, http.StatusOK, metrics.StatusCode)
	require.Contains(t, metrics.Header.Get("Content-Type"), "text/plain")
}

// failingService is an OrderService whose every call fails with err, or panics when err is
// nil: the API must answer with a problem and never leak the cause.
type failingService struct{ err error }

func (f failingService) fail() error {
	if f.err == nil {
		panic("repository exploded")
	}
	return f.err
}
func (f failingService) CreateOrder(context.Context, orders.CreateOrderInput) (orders.CreateOrderResult, error) {
	return orders.CreateOrderResult{}, f.fail()
}
func (f failingService) Order(context.Context, uuid.UUID) (*orders.Order, error) {
	return nil, f.fail()
}
func (f failingService) CancelOrder(context.Context, uuid.UUID, orders.EventMeta) (*orders.Order, error) {
	return nil, f.fail()
}
func (f failingService) Ping(context.Context) error { return f.fail() }

func TestServerErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		err        error
		status     int
		retryAfter string
	}{
		{"Unexpected", errors.New("secret connection string in the error"), http.StatusInternalServerError, ""},
		{"Panic", nil, http.StatusInternalServerError, ""},
		{"Unavailable", orders.Wrap(orders.CodeUnavailable, errors.New("dial tcp: refused"), "The database is unavailable."), http.StatusServiceUnavailable, "5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(ordershttp.NewHandler(ordershttp.Config{Orders: failingService{tc.err}}))
			defer srv.Close()
			b := &bundle{srv: srv}
			for _, r := range []response{
				b.post(t, validBody),
				b.do(t, http.MethodGet, "/orders/"+uuid.NewString(), ""),
				b.do(t, http.MethodPost, "/orders/"+uuid.NewString()+"/cancel", ""),
			} {
				require.Equal(t, tc.status, r.StatusCode, "body: %s", r.body)
				d := r.problem(t)
				require.NotContains(t, d.Detail, "secret")
				require.NotContains(t, d.Detail, "exploded")
				require.Equal(t, tc.retryAfter, r.Header.Get("Retry-After"))
			}
			ready := b.do(t, http.MethodGet, "/readyz", "")
			require.Equal(t, http.StatusServiceUnavailable, ready.StatusCode, "whatever the failure, not ready is 503")
			require.Equal(t, problem.ContentType, ready.Header.Get("Content-Type"))
			require.NotContains(t, string(ready.body), "secret")
			require.NotContains(t, string(ready.body), "exploded")
			require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "").StatusCode, "alive whatever the database")
		})
	}
}

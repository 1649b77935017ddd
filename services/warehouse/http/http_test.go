package http_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// bundle is an API on a migrated database of the test's own.
type bundle struct {
	pool    *pgxpool.Pool
	repo    *postgres.Store
	handler http.Handler
	logs    *logBuffer
}

// logBuffer collects log lines from concurrent handlers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// errors returns the lines logged at ERROR level.
func (l *logBuffer) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return out
}

// testAdminToken is the admin token of every API setupOn builds; [bundle.do] sends it with
// every PUT that names no Authorization of its own.
const testAdminToken = "http-test-admin-token-7f3c9a1e"

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testinfra.NewPool(t)
	return setupOn(t, pool, warehousehttp.Config{})
}

// setupOn builds the API on pool; cfg's Store, Gatherer and Logger are filled in, and its
// AdminToken when empty (testAdminToken).
func setupOn(t *testing.T, pool *pgxpool.Pool, cfg warehousehttp.Config) *bundle {
	t.Helper()
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	repo := newStore(t, pool)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	if cfg.Store == nil {
		cfg.Store = repo
	}
	if cfg.AdminToken == "" {
		cfg.AdminToken = testAdminToken
	}
	cfg.Gatherer = reg
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &bundle{pool: pool, repo: repo, handler: warehousehttp.NewRouter(cfg), logs: logs}
}

// newStore is the store on pool; the API writes no events, so the exchange is a name only.
func newStore(t *testing.T, pool *pgxpool.Pool) *postgres.Store {
	t.Helper()
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	return store
}

type request struct {
	method, path, body, contentType string
	header                          http.Header
}

func (b *bundle) do(t *testing.T, r request) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req := httptest.NewRequestWithContext(context.Background(), r.method, r.path, body)
	if _, ok := r.header["Authorization"]; !ok && r.method == http.MethodPut {
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

// requireProblem checks that rec is a problem document with status and returns it.
func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, status int) problem.Details {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
	var p problem.Details
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
	return p
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var v T
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v), rec.Body.String())
	return v
}

// TestPutStockBadInput sends every kind of bad request to PUT /stock/{sku} and checks the
// status, the problem document, that nothing was written and that nothing was logged as an
// error.
func TestPutStockBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)

	const json = "application/json"
	for _, tc := range []struct {
		name        string
		path        string
		body        string
		contentType string
		header      http.Header // default: If-Match: *
		status      int
		field       string
	}{
		{name: "malformed JSON", body: `{"available":`, contentType: json, status: 400},
		{name: "not JSON at all", body: `twelve`, contentType: json, status: 400},
		{name: "an empty body", body: ``, contentType: json, status: 400},
		{name: "a JSON array", body: `[12]`, contentType: json, status: 400},
		{name: "a JSON number", body: `12`, contentType: json, status: 400},
		{name: "an unknown field", body: `{"available": 12, "colour": "red"}`, contentType: json, status: 400},
		{name: "a second JSON value", body: `{"available": 12} {"available": 13}`, contentType: json, status: 400},
		{name: "trailing garbage", body: `{"available": 12} x`, contentType: json, status: 400},
		{name: "no available", body: `{}`, contentType: json, status: 422, field: "available"},
		{name: "available null", body: `{"available": null}`, contentType: json, status: 422, field: "available"},
		{name: "a null body", body: `null`, contentType: json, status: 400},
		{name: "a negative level", body: `{"available": -1}`, contentType: json, status: 422, field: "available"},
		{name: "a level over a million", body: `{"available": 1000001}`, contentType: json, status: 422, field: "available"},
		{name: "a fractional level", body: `{"available": 12.5}`, contentType: json, status: 422, field: "available"},
		{name: "a level in exponent form", body: `{"available": 1e3}`, contentType: json, status: 422, field: "available"},
		{name: "a huge level", body: `{"available": 100000000000000000000000}`, contentType: json, status: 422, field: "available"},
		{name: "a level as a string", body: `{"available": "12"}`, contentType: json, status: 422, field: "available"},
		{name: "a level as a boolean", body: `{"available": true}`, contentType: json, status: 422, field: "available"},
		{name: "an empty name", body: `{"available": 1, "name": "  "}`, contentType: json, status: 422, field: "name"},
		{name: "a name as a number", body: `{"available": 1, "name": 7}`, contentType: json, status: 422, field: "name"},
		{name: "a name that is too long", body: `{"available": 1, "name": "` + strings.Repeat("é", 201) + `"}`, contentType: json, status: 422, field: "name"},
		{name: "a name with control characters", body: `{"available": 1, "name": "a\u0007b"}`, contentType: json, status: 422, field: "name"},
		{name: "an invalid SKU", path: "/stock/" + url.PathEscape("no spaces!"), body: `{"available": 1}`, contentType: json, status: 422, field: "sku"},
		{name: "a SKU that is too long", path: "/stock/" + strings.Repeat("A", 65), body: `{"available": 1}`, contentType: json, status: 422, field: "sku"},
		{name: "a body over the limit", body: `{"available": 1, "name": "` + strings.Repeat("a", 20<<10) + `"}`, contentType: json, status: 413},
		{name: "a form body", body: `available=12`, contentType: "application/x-www-form-urlencoded", status: 415},
		{name: "text/plain", body: `{"available": 12}`, contentType: "text/plain", status: 415},
		{name: "no content type", body: `{"available": 12}`, status: 415},
		{name: "a garbled content type", body: `{"available": 12}`, contentType: "application/json; =", status: 415},
		{name: "a charset other than UTF-8", body: `{"available": 12}`, contentType: "application/json; charset=latin1", status: 415},
		// The input policy both services share (internal/input, internal/httpapi).
		{name: "a +json media type", body: `{"available": 12}`, contentType: "application/merge-patch+json", status: 415},
		{name: "charset=utf-16", body: `{"available": 12}`, contentType: "application/json; charset=utf-16", status: 415},
		{name: "a duplicate member", body: `{"available": 12, "available": 13}`, contentType: json, status: 400},
		{name: "a field in another case", body: `{"Available": 12}`, contentType: json, status: 400},
		{name: "a field in upper case beside the right one", body: `{"available": 12, "NAME": "x"}`, contentType: json, status: 400},
		{name: "a body that is not UTF-8", body: "{\"available\": 1, \"name\": \"caf\xe9\"}", contentType: json, status: 400},
		{name: "a lone surrogate", body: `{"available": 1, "name": "\ud800"}`, contentType: json, status: 400},
		{name: "a low surrogate first", body: `{"available": 1, "name": "\udc00\ud800"}`, contentType: json, status: 400},
		{name: "NUL in the name", body: `{"available": 1, "name": "a\u0000b"}`, contentType: json, status: 422, field: "name"},
		{name: "ESC in the name", body: `{"available": 1, "name": "\u001b[2Jmug"}`, contentType: json, status: 422, field: "name"},
		{name: "a C1 control in the name", body: `{"available": 1, "name": "mug\u0085"}`, contentType: json, status: 422, field: "name"},
		{name: "a bidi override in the name", body: `{"available": 1, "name": "\u202emug"}`, contentType: json, status: 422, field: "name"},
		{name: "a bidi isolate in the name", body: `{"available": 1, "name": "mug\u2068"}`, contentType: json, status: 422, field: "name"},
		{name: "NUL in the SKU", path: "/stock/BOOK%00", body: `{"available": 1}`, contentType: json, status: 422, field: "sku"},
		{name: "a bidi override in the SKU", path: "/stock/%E2%80%AEBOOK", body: `{"available": 1}`, contentType: json, status: 422, field: "sku"},
		// Preconditions.
		{name: "no If-Match", body: `{"available": 12}`, contentType: json, header: http.Header{}, status: 428},
		{name: "an unquoted If-Match", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {"1"}}, status: 400},
		{name: "an If-Match with control characters", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {"\"1\x01\""}}, status: 400},
		{name: "If-None-Match with an ETag", body: `{"available": 12}`, contentType: json, header: http.Header{"If-None-Match": {`"1"`}}, status: 400},
		{name: "If-None-Match: * on a SKU that exists", body: `{"available": 12}`, contentType: json, header: http.Header{"If-None-Match": {"*"}}, status: 412},
		{name: "If-Match with an old ETag", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {`"999999"`}}, status: 412},
		{name: "If-Match with a weak ETag", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {`W/"1"`}}, status: 412},
		{name: "If-Match with an ETag not of this API", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {`"xyzzy"`}}, status: 412},
		{name: "If-Match on a SKU that does not exist", path: "/stock/NEW-1", body: `{"available": 12}`, contentType: json, header: http.Header{"If-Match": {"*"}}, status: 412},
	} {
		t.Run("answers "+tc.name+" with a problem", func(t *testing.T) {
			t.Parallel()
			path := tc.path
			if path == "" {
				path = "/stock/BOOK-1"
			}
			header := tc.header
			if header == nil {
				header = http.Header{"If-Match": {"*"}}
			}
			p := requireProblem(t, b.do(t, request{method: http.MethodPut, path: path, body: tc.body, contentType: tc.contentType, header: header}), tc.status)
			if tc.field != "" {
				require.Len(t, p.Errors, 1, p)
				require.Equal(t, tc.field, p.Errors[0].Field)
			}
		})
	}

	t.Run("leaves the stock alone after every bad request, and logs no error", func(t *testing.T) {
		t.Parallel()
		item, err := b.repo.GetStock(context.Background(), "BOOK-1")
		require.NoError(t, err)
		require.Equal(t, int64(100), item.Available)
		require.Equal(t, int64(1), item.Version, "never written")
		var moves, skus int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT (SELECT count(*) FROM stock_movements), (SELECT count(*) FROM stock)`).Scan(&moves, &skus))
		require.Equal(t, len(warehouse.Catalogue), moves, "the catalogue's restock rows only")
		require.Equal(t, len(warehouse.Catalogue), skus)
	})
	t.Cleanup(func() { require.Empty(t, b.logs.errors(), "bad input logged as an error") })
}

func TestPutStockChunkedBodyOverLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := httptest.NewServer(b.handler)
	t.Cleanup(srv.Close)
	// No Content-Length: the limit must hold while reading.
	body := io.MultiReader(strings.NewReader(`{"available": 1, "name": "`), strings.NewReader(strings.Repeat("a", 20<<10)), strings.NewReader(`"}`))
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, srv.URL+"/stock/BOOK-1", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", "*")
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode)
	require.Equal(t, problem.ContentType, res.Header.Get("Content-Type"))
}

func TestPutStock(t *testing.T) {
	t.Parallel()

	t.Run("creates a new SKU with 201 and a Location", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := b.do(t, request{method: http.MethodPut, path: "/stock/SOCK-1", body: `{"available": 12, "name": "Saga socks"}`,
			contentType: "application/json; charset=utf-8", header: http.Header{"If-None-Match": {"*"}}})
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Equal(t, "/stock/SOCK-1", rec.Header().Get("Location"))
		require.Equal(t, `"1"`, rec.Header().Get("ETag"))
		item := decode[warehousehttp.StockItem](t, rec)
		require.Equal(t, "SOCK-1", item.SKU)
		require.Equal(t, "Saga socks", item.Name)
		require.Equal(t, int64(12), item.Available)
		require.Zero(t, item.Reserved)
	})

	t.Run("sets an existing SKU with 200, keeping its name", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		etag := b.do(t, request{method: http.MethodGet, path: "/stock/BOOK-1"}).Header().Get("ETag")
		for _, level := range []int64{0, warehouse.MaxAvailable, 7} {
			rec := b.do(t, request{method: http.MethodPut, path: "/stock/BOOK-1", body: `{"available": ` + itoa(level) + `}`, contentType: "application/json",
				header: http.Header{"If-Match": {etag}}})
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			require.NotEqual(t, etag, rec.Header().Get("ETag"), "every write is a new version")
			etag = rec.Header().Get("ETag")
			item := decode[warehousehttp.StockItem](t, rec)
			require.Equal(t, level, item.Available)
			require.Equal(t, "The Go Programming Language", item.Name)
		}
		problems, err := postgres.Verify(context.Background(), b.pool)
		require.NoError(t, err)
		require.Empty(t, problems, "every set has its ledger row")
	})
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestGetRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	orderID := uuid.Must(uuid.NewV7())
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := postgres.Reserve(ctx, tx, orderID, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 1}}, "m1", time.Now())
		return err
	}))

	t.Run("GET /stock lists the catalogue with what is reserved", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodGet, path: "/stock"})
		require.Equal(t, http.StatusOK, rec.Code)
		list := decode[warehousehttp.StockList](t, rec)
		require.Len(t, list.Items, len(warehouse.Catalogue))
		got := map[string][2]int64{}
		for _, i := range list.Items {
			got[i.SKU] = [2]int64{i.Available, i.Reserved}
		}
		require.Equal(t, [2]int64{98, 2}, got["BOOK-1"])
		require.Equal(t, [2]int64{49, 1}, got["MUG-1"])
		require.Equal(t, [2]int64{10, 0}, got["BAG-1"])
	})

	t.Run("HEAD /stock answers like GET without a body", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodHead, path: "/stock"})
		require.Equal(t, http.StatusOK, rec.Code)
	})

	t.Run("GET /stock/{sku} returns one SKU", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodGet, path: "/stock/BOOK-1"})
		require.Equal(t, http.StatusOK, rec.Code)
		item := decode[warehousehttp.StockItem](t, rec)
		require.Equal(t, warehousehttp.StockItem{SKU: "BOOK-1", Name: "The Go Programming Language", Available: 98, Reserved: 2,
			UpdatedAt: item.UpdatedAt}, item)
	})

	t.Run("GET /reservations/{order_id} returns the reservation and its lines", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodGet, path: "/reservations/" + orderID.String()})
		require.Equal(t, http.StatusOK, rec.Code)
		r := decode[warehousehttp.Reservation](t, rec)
		require.Equal(t, orderID, r.OrderID)
		require.Equal(t, "RESERVED", r.Status)
		require.True(t, r.Held)
		require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 1}}, r.Lines)
	})

	for _, tc := range []struct {
		name, method, path string
		status             int
	}{
		{"an unknown SKU", http.MethodGet, "/stock/NOPE-1", 404},
		{"an impossible SKU", http.MethodGet, "/stock/" + url.PathEscape("a b"), 404},
		{"an unknown order", http.MethodGet, "/reservations/" + uuid.Must(uuid.NewV7()).String(), 404},
		{"an order id that is not a UUID", http.MethodGet, "/reservations/order-1", 404},
		{"an order id in another UUID spelling", http.MethodGet, "/reservations/" + strings.ReplaceAll(orderID.String(), "-", ""), 404},
		{"an order id in upper case", http.MethodGet, "/reservations/" + strings.ToUpper(orderID.String()), 404},
		{"an order id as a URN", http.MethodGet, "/reservations/urn:uuid:" + orderID.String(), 404},
		{"an order id in braces", http.MethodGet, "/reservations/%7B" + orderID.String() + "%7D", 404},
		{"a method the reservations do not allow", http.MethodPut, "/reservations/" + orderID.String(), 405},
		{"an unknown route", http.MethodGet, "/orders", 404},
		{"a method the route does not allow", http.MethodDelete, "/stock/BOOK-1", 405},
		{"POST on the stock list", http.MethodPost, "/stock", 405},
	} {
		t.Run("answers "+tc.name+" with a problem", func(t *testing.T) {
			t.Parallel()
			rec := b.do(t, request{method: tc.method, path: tc.path})
			requireProblem(t, rec, tc.status)
			if tc.status == http.StatusMethodNotAllowed {
				require.NotEmpty(t, rec.Header().Values("Allow"))
			}
		})
	}

	t.Run("405 lists the allowed methods", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodDelete, path: "/stock/BOOK-1"})
		require.Equal(t, []string{"GET", "HEAD", "PUT"}, rec.Header().Values("Allow"))
	})

	t.Run("echoes X-Request-ID, or makes one", func(t *testing.T) {
		t.Parallel()
		rec := b.do(t, request{method: http.MethodGet, path: "/healthz", header: http.Header{"X-Request-Id": {"req-42"}}})
		require.Equal(t, "req-42", rec.Header().Get("X-Request-ID"))
		rec = b.do(t, request{method: http.MethodGet, path: "/healthz", header: http.Header{"X-Request-Id": {"bad id\x7f"}}})
		require.NotEqual(t, "bad id\x7f", rec.Header().Get("X-Request-ID"))
		require.NotEmpty(t, rec.Header().Get("X-Request-ID"))
	})

	t.Run("GET /healthz, /readyz and /metrics answer", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/healthz"}).Code)
		rec := b.do(t, request{method: http.MethodGet, path: "/readyz"})
		require.Equal(t, http.StatusOK, rec.Code)
		require.Contains(t, rec.Body.String(), `"database":"up"`)
		rec = b.do(t, request{method: http.MethodGet, path: "/metrics"})
		require.Equal(t, http.StatusOK, rec.Code)
		require.Contains(t, rec.Body.String(), "go_goroutines")
	})
}

// panicStore is the real repository, except that listing panics: a stand-in for a bug.
type panicStore struct{ *postgres.Store }

func (panicStore) ListStock(context.Context, string, int) ([]warehouse.StockItem, error) {
	panic("boom")
}

func TestPanicIsA500Problem(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t)
	b := setupOn(t, pool, warehousehttp.Config{Store: panicStore{newStore(t, pool)}})
	p := requireProblem(t, b.do(t, request{method: http.MethodGet, path: "/stock"}), http.StatusInternalServerError)
	require.NotContains(t, p.Detail, "boom")
}

func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testinfra.PostgresURL(t))
	require.NoError(t, err)
	proxy := testinfra.NewProxy(t, u.Host)
	pool, err := pgxpool.New(context.Background(), proxy.RewriteURL(t, testinfra.DatabaseURL(t)))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := setupOn(t, pool, warehousehttp.Config{DBTimeout: 2 * time.Second})

	require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/readyz"}).Code)
	require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/stock"}).Code)

	proxy.Cut()
	for _, r := range []request{
		{method: http.MethodGet, path: "/readyz"},
		{method: http.MethodGet, path: "/stock"},
		{method: http.MethodGet, path: "/stock/BOOK-1"},
		{method: http.MethodPut, path: "/stock/BOOK-1", body: `{"available": 3}`, contentType: "application/json", header: http.Header{"If-Match": {"*"}}},
		{method: http.MethodGet, path: "/reservations/" + uuid.Must(uuid.NewV7()).String()},
	} {
		t.Run(r.method+" "+r.path+" is 503 with Retry-After while the database is down", func(t *testing.T) {
			rec := b.do(t, r)
			requireProblem(t, rec, http.StatusServiceUnavailable)
			require.Equal(t, "5", rec.Header().Get("Retry-After"))
		})
	}
	t.Run("GET /healthz stays 200: the process is alive", func(t *testing.T) {
		require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/healthz"}).Code)
	})

	proxy.Heal()
	t.Run("ready again once the database is back", func(t *testing.T) {
		testinfra.Eventually(t, 20*time.Second, func() bool {
			return b.do(t, request{method: http.MethodGet, path: "/readyz"}).Code == http.StatusOK
		}, "/readyz is 200 again")
		require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/stock"}).Code)
	})
}

// TestListStockPages walks GET /stock page by page: every SKU once, in SKU order, a next link
// on every page but the last, and a bad limit or cursor refused.
func TestListStockPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 7 {
		_, _, err := b.repo.SetStock(context.Background(), fmt.Sprintf("ZZ-%02d", i), "", int64(i))
		require.NoError(t, err)
	}
	var (
		skus  []string
		pages int
	)
	for path := "/stock?limit=5"; path != ""; pages++ {
		rec := b.do(t, request{method: http.MethodGet, path: path})
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		list := decode[warehousehttp.StockList](t, rec)
		require.LessOrEqual(t, len(list.Items), 5)
		for _, i := range list.Items {
			skus = append(skus, i.SKU)
		}
		if list.Next != "" {
			require.Equal(t, `<`+list.Next+`>; rel="next"`, rec.Header().Get("Link"))
		} else {
			require.Empty(t, rec.Header().Get("Link"))
		}
		path = list.Next
	}
	require.Equal(t, 3, pages, "12 SKUs in pages of 5")
	require.Equal(t, []string{"BAG-1", "BOOK-1", "MUG-1", "PEN-1", "TEE-1", "ZZ-00", "ZZ-01", "ZZ-02", "ZZ-03", "ZZ-04", "ZZ-05", "ZZ-06"}, skus)

	all := decode[warehousehttp.StockList](t, b.do(t, request{method: http.MethodGet, path: "/stock"}))
	require.Len(t, all.Items, 12, "the default page holds them all")
	require.Empty(t, all.Next)

	for _, path := range []string{
		"/stock?limit=0", "/stock?limit=1001", "/stock?limit=ten", "/stock?limit=1&limit=2",
		"/stock?cursor=%21%21", "/stock?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("no spaces!")),
	} {
		p := requireProblem(t, b.do(t, request{method: http.MethodGet, path: path}), http.StatusBadRequest)
		require.Equal(t, problem.TypeInvalidQuery, p.Type, path)
	}
	require.Empty(t, b.logs.errors())
}

// TestPutStockRace is an operator's read-modify-write with a reservation in between: the
// write carries the ETag of the read, is refused with 412, and the reservation stands.
func TestPutStockRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	read := b.do(t, request{method: http.MethodGet, path: "/stock/BOOK-1"})
	require.Equal(t, http.StatusOK, read.Code)
	etag := read.Header().Get("ETag")
	require.NotEmpty(t, etag)
	require.Equal(t, int64(100), decode[warehousehttp.StockItem](t, read).Available)

	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := postgres.Reserve(ctx, tx, uuid.Must(uuid.NewV7()), []warehouse.Line{{SKU: "BOOK-1", Quantity: 3}}, "m-race", time.Now())
		return err
	}))

	// The operator meant "100 + 20 received".
	write := request{method: http.MethodPut, path: "/stock/BOOK-1", body: `{"available": 120}`, contentType: "application/json",
		header: http.Header{"If-Match": {etag}}}
	p := requireProblem(t, b.do(t, write), http.StatusPreconditionFailed)
	require.Equal(t, problem.TypePreconditionFailed, p.Type)
	item, err := b.repo.GetStock(ctx, "BOOK-1")
	require.NoError(t, err)
	require.Equal(t, int64(97), item.Available, "the reservation was not overwritten")
	require.Equal(t, int64(3), item.Reserved)

	// Read again, write again: now it applies.
	read = b.do(t, request{method: http.MethodGet, path: "/stock/BOOK-1"})
	write.body = `{"available": 117}`
	write.header = http.Header{"If-Match": {`"1", ` + read.Header().Get("ETag")}}
	rec := b.do(t, write)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, int64(117), decode[warehousehttp.StockItem](t, rec).Available)
	problems, err := postgres.Verify(ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, problems)
}

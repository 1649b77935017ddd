package http_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// TestAdmin checks that PUT /stock/{sku}, the one route that changes data outside the saga,
// answers only the admin token, that the reads stay open, and that the token shows nowhere.
func TestAdmin(t *testing.T) {
	t.Parallel()
	put := func(auth ...string) request {
		r := request{method: http.MethodPut, path: "/stock/BOOK-1", body: `{"available": 5}`, contentType: "application/json",
			header: http.Header{"If-Match": {"*"}, "Authorization": auth}}
		return r
	}
	const challenge = `Bearer realm="warehouse-admin"`

	t.Run("the token sets the stock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := b.do(t, put("Bearer "+testAdminToken))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	})

	t.Run("no or a malformed Authorization is 401 with the challenge, and writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, auth := range [][]string{nil, {""}, {"Basic " + testAdminToken}, {"Bearer"}, {testAdminToken}} {
			rec := b.do(t, put(auth...))
			p := requireProblem(t, rec, http.StatusUnauthorized)
			require.Equal(t, problem.TypeUnauthorized, p.Type)
			require.Equal(t, challenge, rec.Header().Get("WWW-Authenticate"), "%q", auth)
		}
		requireAvailable(t, b, "BOOK-1", 100)
	})

	t.Run("a wrong token is 401 invalid_token, and writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := b.do(t, put("Bearer wrong-admin-token-0123456789"))
		p := requireProblem(t, rec, http.StatusUnauthorized)
		require.Equal(t, problem.TypeUnauthorized, p.Type)
		require.Contains(t, rec.Header().Get("WWW-Authenticate"), challenge+`, error="invalid_token"`)
		requireAvailable(t, b, "BOOK-1", 100)
	})

	t.Run("the token comes before the precondition and the body", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := b.do(t, request{method: http.MethodPut, path: "/stock/BOOK-1", body: `nonsense`, header: http.Header{"Authorization": nil}})
		requireProblem(t, rec, http.StatusUnauthorized)
	})

	t.Run("without a token configured the admin API is disabled: 403", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, postgres.Migrate(context.Background(), pool))
		b := &bundle{pool: pool, handler: warehousehttp.NewRouter(warehousehttp.Config{Store: newStore(t, pool)})}
		for _, auth := range [][]string{nil, {"Bearer " + testAdminToken}} {
			rec := b.do(t, put(auth...))
			p := requireProblem(t, rec, http.StatusForbidden)
			require.Equal(t, problem.TypeForbidden, p.Type)
			require.Equal(t, "the admin API is disabled: set WAREHOUSE_ADMIN_TOKEN or WAREHOUSE_ADMIN_TOKEN_FILE", p.Detail)
		}
		require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: "/stock/BOOK-1"}).Code, "reads stay open")
		requireAvailable(t, b, "BOOK-1", 100)
	})

	t.Run("the reads stay open", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, path := range []string{"/stock", "/stock/BOOK-1", "/healthz", "/readyz", "/metrics"} {
			require.Equal(t, http.StatusOK, b.do(t, request{method: http.MethodGet, path: path}).Code, path)
		}
		require.Equal(t, http.StatusNotFound, b.do(t, request{method: http.MethodGet, path: "/reservations/0197a0f2-3c4d-7e8f-9a0b-1c2d3e4f5a6b"}).Code)
	})

	t.Run("the token is in no log line, answer, span or metric", func(t *testing.T) {
		t.Parallel()
		spans := tracetest.NewSpanRecorder()
		reg := prometheus.NewRegistry()
		m, err := warehousehttp.NewMetrics(reg, prometheus.Labels{"service": "test"})
		require.NoError(t, err)
		b := setupOn(t, testinfra.NewPool(t), warehousehttp.Config{
			Metrics: m, TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		})
		var seen strings.Builder
		for _, auth := range []string{"Bearer " + testAdminToken, "Bearer " + testAdminToken + "x", "Bearer " + testAdminToken[1:],
			"Basic " + testAdminToken, "Bearer " + testAdminToken + " " + testAdminToken} {
			rec := b.do(t, put(auth))
			fmt.Fprintf(&seen, "%d %v %s\n", rec.Code, rec.Header(), rec.Body)
		}
		require.Contains(t, seen.String(), "200 ", "one request succeeded")
		require.Contains(t, seen.String(), "401 ", "the others were refused")

		b.logs.mu.Lock()
		logs := b.logs.buf.String()
		b.logs.mu.Unlock()
		require.Contains(t, logs, "request refused", "the refusals were logged (at debug level)")
		require.Contains(t, logs, "stock set")
		for _, s := range spans.Ended() {
			fmt.Fprintf(&seen, "%s %v %v %v\n", s.Name(), s.Attributes(), s.Events(), s.Status())
		}
		require.Len(t, spans.Ended(), 5, "a span per request")
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			fmt.Fprintln(&seen, f.String())
		}
		require.NotContains(t, logs, testAdminToken)
		require.NotContains(t, seen.String(), testAdminToken)
	})
}

// requireAvailable checks a SKU's available stock through GET /stock/{sku}.
func requireAvailable(t *testing.T, b *bundle, sku string, want int64) {
	t.Helper()
	item := decode[warehousehttp.StockItem](t, b.do(t, request{method: http.MethodGet, path: "/stock/" + sku}))
	require.Equal(t, want, item.Available)
}

package http_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/metricstest"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
)

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("API", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewPedanticRegistry()
		m, err := warehousehttp.NewMetrics(reg, prometheus.Labels{"service": "test"})
		require.NoError(t, err)
		b := setupOn(t, testinfra.NewPool(t), warehousehttp.Config{Metrics: m})
		id := uuid.Must(uuid.NewV7()).String()
		for _, r := range []struct {
			req    request
			status int
		}{
			{request{method: http.MethodGet, path: "/stock"}, http.StatusOK},
			{request{method: http.MethodGet, path: "/stock/BOOK-1"}, http.StatusOK},
			{request{method: http.MethodHead, path: "/stock/MUG-1"}, http.StatusOK},
			{request{method: http.MethodGet, path: "/stock/NOPE-1"}, http.StatusNotFound},
			{request{method: http.MethodPut, path: "/stock/NEW-1", body: `{"available": 3}`, contentType: "application/json",
				header: http.Header{"If-None-Match": {"*"}}}, http.StatusCreated},
			{request{method: http.MethodGet, path: "/reservations/" + id}, http.StatusNotFound},
			{request{method: http.MethodGet, path: "/nothing/" + id}, http.StatusNotFound},
			{request{method: http.MethodDelete, path: "/stock/BOOK-1"}, http.StatusMethodNotAllowed},
			{request{method: "BREW", path: "/stock"}, http.StatusMethodNotAllowed},
		} {
			require.Equal(t, r.status, b.do(t, r.req).Code, "%s %s", r.req.method, r.req.path)
		}

		counts, durations := metricstest.HTTPRequests(t, reg, "test")
		require.Equal(t, map[string]float64{
			"/stock GET 200":                   1,
			"/stock/{sku} GET 200":             1,
			"/stock/{sku} HEAD 200":            1,
			"/stock/{sku} GET 404":             1,
			"/stock/{sku} PUT 201":             1,
			"/reservations/{order_id} GET 404": 1,
			"unmatched GET 404":                1,
			"unmatched DELETE 405":             1,
			"unmatched other 405":              1,
		}, counts)
		require.Equal(t, uint64(2), durations["/stock/{sku} GET"])
		problems, err := testutil.GatherAndLint(reg)
		require.NoError(t, err)
		require.Empty(t, problems)
	})

	t.Run("RelayPort", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewPedanticRegistry()
		m, err := warehousehttp.NewMetrics(reg, prometheus.Labels{"service": "test"})
		require.NoError(t, err)
		h := warehousehttp.NewRouter(warehousehttp.Config{Gatherer: reg, Metrics: m})
		for _, path := range []string{"/healthz", "/metrics", "/stock"} {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
		}
		counts, _ := metricstest.HTTPRequests(t, reg, "test")
		require.Equal(t, map[string]float64{"/healthz GET 200": 1, "/metrics GET 200": 1, "unmatched GET 404": 1}, counts)
	})
}

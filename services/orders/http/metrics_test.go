package http_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/metricstest"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
)

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("API", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		created := b.post(t, validBody)
		require.Equal(t, http.StatusCreated, created.StatusCode, "body: %s", created.body)
		id := created.order(t).ID
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/orders/"+id, "").StatusCode)
		require.Equal(t, http.StatusOK, b.do(t, http.MethodHead, "/orders/"+id, "").StatusCode)
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/orders/not-an-id", "").StatusCode)
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/products/"+id, "").StatusCode)
		require.Equal(t, http.StatusMethodNotAllowed, b.do(t, http.MethodDelete, "/orders/"+id, "").StatusCode)
		require.Equal(t, http.StatusMethodNotAllowed, b.do(t, "BREW", "/orders", "").StatusCode)
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "").StatusCode)

		counts, durations := metricstest.HTTPRequests(t, b.reg, "test")
		require.Equal(t, map[string]float64{
			"/orders POST 201":      1,
			"/orders/{id} GET 200":  1,
			"/orders/{id} HEAD 200": 1,
			"/orders/{id} GET 404":  1,
			"unmatched GET 404":     1,
			"unmatched DELETE 405":  1,
			"unmatched other 405":   1,
			"/healthz GET 200":      1,
		}, counts)
		require.Equal(t, uint64(2), durations["/orders/{id} GET"])
		for k := range counts {
			require.NotContains(t, k, id, "no label holds an id")
		}
		problems, err := testutil.GatherAndLint(b.reg)
		require.NoError(t, err)
		require.Empty(t, problems)
	})

	t.Run("Ops", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewPedanticRegistry()
		m, err := ordershttp.NewMetrics(reg, prometheus.Labels{"service": "test"})
		require.NoError(t, err)
		srv := httptest.NewServer(ordershttp.NewOpsHandler(ordershttp.OpsConfig{Gatherer: reg, Metrics: m}))
		defer srv.Close()
		for _, path := range []string{"/healthz", "/metrics", "/orders"} {
			res, err := srv.Client().Get(srv.URL + path)
			require.NoError(t, err)
			res.Body.Close()
		}
		counts, _ := metricstest.HTTPRequests(t, reg, "test")
		require.Equal(t, map[string]float64{"/healthz GET 200": 1, "/metrics GET 200": 1, "unmatched GET 404": 1}, counts)
	})

	t.Run("NoMetrics", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(ordershttp.NewOpsHandler(ordershttp.OpsConfig{}))
		defer srv.Close()
		res, err := srv.Client().Get(srv.URL + "/healthz")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
	})
}

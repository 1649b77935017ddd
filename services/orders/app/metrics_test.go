package app_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/metricstest"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders/app"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
)

// TestMetrics runs the whole service, moves an order through the saga, and checks what
// /metrics serves against docs/metrics.md: every family of the orders service, the relay,
// the outbox table and the inbox, each with service="orders", no id in any label, and an
// exposition that GatherAndLint and promtool accept.
func TestMetrics(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ch, q := listen(t, cfg, "order.*") // the relay's events are routed, so it publishes them
	a := start(t, cfg, app.ModeAll)

	// An order, and a retry of its request: one order is created.
	created := call(t, http.MethodPost, a.URL()+"/orders", orderBody, "Idempotency-Key: metrics-1")
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	replayed := call(t, http.MethodPost, a.URL()+"/orders", orderBody, "Idempotency-Key: metrics-1")
	require.Equal(t, http.StatusCreated, replayed.status)
	require.Equal(t, "true", replayed.header.Get("Idempotent-Replayed"))
	order := decodeOrder(t, created)
	require.Equal(t, "OrderCreated", next(t, ch, q).Type)

	// The warehouse's answer arrives twice (one is a duplicate), and a message of a type the
	// consumer does not know is dead-lettered.
	publishStock(t, cfg, "wh-metrics-1", "StockReserved", "stock.reserved", order.ID, "req-metrics")
	publishStock(t, cfg, "wh-metrics-1", "StockReserved", "stock.reserved", order.ID, "req-metrics")
	publishStock(t, cfg, "wh-metrics-2", "StockExploded", "stock.reserved", order.ID, "req-metrics")
	waitStatus(t, a, order.ID, "RESERVED")
	require.Equal(t, http.StatusNotFound, call(t, http.MethodGet, a.URL()+"/nothing/"+order.ID, "").status)

	var (
		body     string
		families metricstest.Families
	)
	testinfra.Eventually(t, 20*time.Second, func() bool {
		body, families = metricstest.Scrape(t, a.URL()+"/metrics")
		duplicates, _ := metricstest.Value(families, "inbox_duplicates_total", nil)
		dead, _ := metricstest.Value(families, "inbox_dead_lettered_total", nil)
		published, _ := metricstest.Value(families, "outbox_published_total", nil)
		return duplicates == 1 && dead == 1 && published >= 1
	}, "the duplicate, the dead letter and the publish are counted")

	metricstest.Check(t, metricstest.LoadContract(t).For(app.ServiceName), families, app.ServiceName)
	metricstest.Lint(t, families)
	metricstest.Promtool(t, body)

	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := metricstest.Value(families, name, labels)
		require.True(t, ok, "%s%v not exported", name, labels)
		return v
	}
	t.Run("Orders", func(t *testing.T) {
		require.Equal(t, 1.0, value("orders_created_total", nil), "a replay is not an order")
		require.Equal(t, 1.0, value("orders_outcomes_total", map[string]string{"status": "RESERVED"}), "a duplicate is not counted")
		require.Equal(t, 0.0, value("orders_outcomes_total", map[string]string{"status": "REJECTED"}))
		require.Equal(t, 0.0, value("orders_outcomes_total", map[string]string{"status": "CANCELLED"}))
	})
	t.Run("HTTP", func(t *testing.T) {
		routes := metricstest.LabelValues(families, "http_requests_total", "route")
		require.Subset(t, routes, []string{"/orders", "/orders/{id}", ordershttp.RouteUnmatched})
		require.Equal(t, 2.0, value("http_requests_total", map[string]string{"route": "/orders", "method": "POST", "code": "201"}))
		require.NotContains(t, body, order.ID, "no label holds an id")
		for _, r := range routes {
			require.False(t, strings.Contains(r, "nothing"), "raw path %q as a route", r)
		}
	})
	t.Run("Inbox", func(t *testing.T) {
		require.Equal(t, 1.0, value("inbox_messages_processed_total", map[string]string{"consumer": "orders", "type": "StockReserved"}))
		require.Equal(t, 1.0, value("inbox_dead_lettered_total", map[string]string{"type": "other", "reason": "permanent-error"}))
		require.Equal(t, cfg.InboxRetention.Seconds(), value("inbox_retention_seconds", nil))
		// 5 deliveries from 10ms (10+20+40+80ms) + 10 relay attempts from 1s (1+2+…+256s).
		require.InDelta(t, 511.15, value("inbox_redelivery_window_seconds", nil), 1e-9)
		require.Equal(t, 1.0, value("inbox_broker_connected", nil))
	})
	t.Run("Outbox", func(t *testing.T) {
		require.Equal(t, 1.0, value("outbox_relay_state", map[string]string{"state": "running"}))
		require.Equal(t, 1.0, value("outbox_broker_connected", nil))
		require.GreaterOrEqual(t, value("outbox_commit_to_confirm_seconds", nil), 1.0)
	})
	t.Run("Pool", func(t *testing.T) {
		require.Equal(t, float64(cfg.DatabaseMaxConns), value("pgxpool_max_conns", nil))
		require.Greater(t, value("pgxpool_acquires_total", nil), 0.0)
	})
}

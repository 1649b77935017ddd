package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/metricstest"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
)

// publish publishes a message as the orders service's relay would, with the given id.
func publish(t *testing.T, ch *amqp091.Channel, cfg app.Config, messageID, typ, key string, body any) {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	conf, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), cfg.EventsExchange, key, true, false,
		amqp091.Publishing{
			MessageId: messageID, Type: typ, ContentType: "application/json", DeliveryMode: amqp091.Persistent,
			CorrelationId: "req-metrics", Body: data,
		})
	require.NoError(t, err)
	ok, err := conf.WaitContext(context.Background())
	require.NoError(t, err)
	require.True(t, ok)
}

// put sets a SKU's stock whatever it is now (If-Match: *), or creates it with
// If-None-Match: * when precondition is that, with the admin token of testConfig.
func put(t *testing.T, rawURL, body string, precondition ...string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, rawURL, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", "*")
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	if len(precondition) > 0 {
		req.Header.Del("If-Match")
		name, value, _ := strings.Cut(precondition[0], ":")
		req.Header.Set(name, strings.TrimSpace(value))
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

func orderCreated(orderID uuid.UUID, lines ...warehouse.Line) map[string]any {
	return map[string]any{"version": 1, "order_id": orderID, "customer_id": "c-42", "items": lines, "created_at": time.Now().UTC()}
}

// answers waits for n messages on the stock queue and returns their types, sorted.
func answers(t *testing.T, stock <-chan amqp091.Delivery, n int) []string {
	t.Helper()
	var types []string
	for range n {
		select {
		case d := <-stock:
			types = append(types, d.Type)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %v on the stock.# queue within 30s, want %d answers", types, n)
		}
	}
	slices.Sort(types)
	return types
}

// TestMetrics runs the whole warehouse, reserves, rejects and releases, and checks what
// /metrics serves against docs/metrics.md: every family of the warehouse, the relay, the
// outbox table and the inbox, each with service="warehouse", no id in any label, and an
// exposition that GatherAndLint and promtool accept.
func TestMetrics(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ch := channel(t, cfg.AMQPURL)
	stock := stockQueue(t, ch, cfg)
	a := start(t, cfg, app.ModeAll)
	base := "http://" + a.HTTPAddr()
	testinfra.Eventually(t, 20*time.Second, a.Consuming, "the consumer is consuming")

	// Two orders reserved (one of them delivered twice), one rejected, and a message of a type
	// the warehouse does not know, dead-lettered.
	released, kept, rejected := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	publish(t, ch, cfg, "m-released", warehouse.TypeOrderCreated, warehouse.RoutingKeyOrderCreated,
		orderCreated(released, warehouse.Line{SKU: "BOOK-1", Quantity: 2}))
	publish(t, ch, cfg, "m-released", warehouse.TypeOrderCreated, warehouse.RoutingKeyOrderCreated,
		orderCreated(released, warehouse.Line{SKU: "BOOK-1", Quantity: 2}))
	publish(t, ch, cfg, "m-kept", warehouse.TypeOrderCreated, warehouse.RoutingKeyOrderCreated,
		orderCreated(kept, warehouse.Line{SKU: "MUG-1", Quantity: 3}))
	publish(t, ch, cfg, "m-rejected", warehouse.TypeOrderCreated, warehouse.RoutingKeyOrderCreated,
		orderCreated(rejected, warehouse.Line{SKU: "BAG-1", Quantity: 11}))
	publish(t, ch, cfg, "m-exploded", "OrderExploded", warehouse.RoutingKeyOrderCreated, orderCreated(rejected))
	require.Equal(t, []string{warehouse.TypeStockRejected, warehouse.TypeStockReserved, warehouse.TypeStockReserved}, answers(t, stock, 3))

	// The first order is cancelled: its stock comes back.
	publish(t, ch, cfg, "m-cancel", warehouse.TypeOrderCancelled, warehouse.RoutingKeyOrderCancelled,
		map[string]any{"version": 1, "order_id": released, "cancelled_at": time.Now().UTC()})
	require.Equal(t, []string{warehouse.TypeStockReleased}, answers(t, stock, 1))

	// The API: stock set after everything above (so a gauge that shows it shows the rest), a
	// SKU outside the catalogue, a reservation, an unknown route.
	require.Equal(t, http.StatusOK, put(t, base+"/stock/PEN-1", `{"available": 123}`))
	require.Equal(t, http.StatusCreated, put(t, base+"/stock/SOCK-1", `{"available": 5}`, "If-None-Match: *"))
	status, _ := get(t, base+"/reservations/"+kept.String())
	require.Equal(t, http.StatusOK, status)
	status, _ = get(t, base+"/stock/MUG-1")
	require.Equal(t, http.StatusOK, status)
	status, _ = get(t, base+"/nothing/"+kept.String())
	require.Equal(t, http.StatusNotFound, status)

	var (
		body     string
		families metricstest.Families
	)
	testinfra.Eventually(t, 3*app.StockMetricsInterval+10*time.Second, func() bool {
		body, families = metricstest.Scrape(t, base+"/metrics")
		duplicates, _ := metricstest.Value(families, "inbox_duplicates_total", nil)
		dead, _ := metricstest.Value(families, "inbox_dead_lettered_total", nil)
		published, _ := metricstest.Value(families, "outbox_published_total", nil)
		pens, _ := metricstest.Value(families, "warehouse_stock_available", map[string]string{"sku": "PEN-1"})
		return duplicates == 1 && dead == 1 && published >= 4 && pens == 123
	}, "the duplicate, the dead letter, the answers and the stock are counted")

	metricstest.Check(t, metricstest.LoadContract(t).For(app.ServiceName), families, app.ServiceName)
	metricstest.Lint(t, families)
	metricstest.Promtool(t, body)

	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := metricstest.Value(families, name, labels)
		require.True(t, ok, "%s%v not exported", name, labels)
		return v
	}
	t.Run("Warehouse", func(t *testing.T) {
		require.Equal(t, 2.0, value("warehouse_reservations_total", map[string]string{"result": "reserved"}), "a duplicate is not counted")
		require.Equal(t, 1.0, value("warehouse_reservations_total", map[string]string{"result": "rejected"}))
		require.Equal(t, 1.0, value("warehouse_releases_total", nil))
		var catalogue []string
		for _, c := range warehouse.Catalogue {
			catalogue = append(catalogue, c.SKU)
		}
		slices.Sort(catalogue)
		require.Equal(t, catalogue, metricstest.LabelValues(families, "warehouse_stock_available", "sku"), "the catalogue only")
		require.Equal(t, 47.0, value("warehouse_stock_available", map[string]string{"sku": "MUG-1"}), "reserved")
		require.Equal(t, 100.0, value("warehouse_stock_available", map[string]string{"sku": "BOOK-1"}), "reserved, then released")
	})
	t.Run("HTTP", func(t *testing.T) {
		routes := metricstest.LabelValues(families, "http_requests_total", "route")
		require.Subset(t, routes, []string{"/stock/{sku}", "/reservations/{order_id}", warehousehttp.RouteUnmatched})
		require.Equal(t, 1.0, value("http_requests_total", map[string]string{"route": "/stock/{sku}", "method": "PUT", "code": "201"}))
		for _, id := range []uuid.UUID{released, kept, rejected} {
			require.NotContains(t, body, id.String(), "no label holds an id")
		}
		require.NotContains(t, body, "SOCK-1", "no label holds a SKU outside the catalogue")
		for _, r := range routes {
			require.False(t, strings.Contains(r, "MUG-1") || strings.Contains(r, "nothing"), "raw path %q as a route", r)
		}
	})
	t.Run("Inbox", func(t *testing.T) {
		require.Equal(t, 3.0, value("inbox_messages_processed_total", map[string]string{"consumer": "warehouse", "type": "OrderCreated"}))
		require.Equal(t, 1.0, value("inbox_messages_processed_total", map[string]string{"type": "OrderCancelled"}))
		require.Equal(t, 1.0, value("inbox_dead_lettered_total", map[string]string{"type": "other", "reason": "permanent-error"}))
		require.Equal(t, cfg.InboxRetention.Seconds(), value("inbox_retention_seconds", nil))
		// 5 deliveries from 50ms (50+100+200+400ms) + 10 relay attempts from 1s (1+2+…+256s).
		require.InDelta(t, 511.75, value("inbox_redelivery_window_seconds", nil), 1e-9)
		require.Equal(t, 1.0, value("inbox_broker_connected", nil))
	})
	t.Run("Outbox", func(t *testing.T) {
		require.Equal(t, 1.0, value("outbox_relay_state", map[string]string{"state": "running"}))
		require.Equal(t, 1.0, value("outbox_broker_connected", nil))
		require.GreaterOrEqual(t, value("outbox_commit_to_confirm_seconds", nil), 4.0)
	})
	t.Run("Pool", func(t *testing.T) {
		require.Equal(t, float64(cfg.DatabaseMaxConns), value("pgxpool_max_conns", nil))
		require.Greater(t, value("pgxpool_acquires_total", nil), 0.0)
	})
}

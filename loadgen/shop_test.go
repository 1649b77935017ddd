package loadgen_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/loadgen"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// shop is both services running in-process, as in e2e/shop_test.go, with the test's own
// databases and topology.
type shop struct {
	orders    *pgxpool.Pool
	ordersURL string
}

func startShop(t *testing.T) *shop {
	t.Helper()
	ctx := context.Background()
	amqpURL := testinfra.AMQPURL(t)
	exchange, dlx := testinfra.UniqueName(t, "events"), testinfra.UniqueName(t, "dlx")

	wcfg := warehouseapp.DefaultConfig()
	wcfg.DatabaseURL, wcfg.AMQPURL = testinfra.DatabaseURL(t), amqpURL
	wcfg.HTTPAddr, wcfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	wcfg.EventsExchange, wcfg.DeadLetterExchange = exchange, dlx
	wcfg.Queue, wcfg.DeadLetterQueue = testinfra.UniqueName(t, "warehouse"), testinfra.UniqueName(t, "warehouse_dead")
	wcfg.RelayPollInterval = 100 * time.Millisecond
	wcfg.ConsumerRetryBaseDelay = 50 * time.Millisecond

	ocfg := ordersapp.DefaultConfig()
	ocfg.DatabaseURL, ocfg.AMQPURL = testinfra.DatabaseURL(t), amqpURL
	ocfg.HTTPAddr, ocfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	ocfg.EventsExchange, ocfg.DeadLetterExchange = exchange, dlx
	ocfg.Queue, ocfg.DeadLetterQueue = testinfra.UniqueName(t, "orders"), testinfra.UniqueName(t, "orders_dead")
	ocfg.RelayPollInterval = 100 * time.Millisecond
	ocfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	t.Cleanup(func() {
		deleteTopology(t, amqpURL, []string{exchange, dlx}, wcfg.Queue, wcfg.DeadLetterQueue, ocfg.Queue, ocfg.DeadLetterQueue)
	})

	// Each service declares the queue it consumes: both must be up before events flow.
	warehouse, err := warehouseapp.New(wcfg, warehouseapp.ModeAll, warehouseapp.Options{})
	require.NoError(t, err)
	require.NoError(t, warehouse.Start(ctx))
	t.Cleanup(func() { require.NoError(t, warehouse.Stop()) })
	orders, err := ordersapp.New(ocfg, ordersapp.ModeAll, ordersapp.Options{})
	require.NoError(t, err)
	require.NoError(t, orders.Start(ctx))
	t.Cleanup(func() { require.NoError(t, orders.Stop()) })
	testinfra.Eventually(t, 30*time.Second, warehouse.Consuming, "warehouse consuming")
	return &shop{orders: orders.Pool(), ordersURL: orders.URL()}
}

func deleteTopology(t *testing.T, url string, exchanges []string, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range queues {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	for _, ex := range exchanges {
		require.NoError(t, ch.ExchangeDelete(ex, false, false))
	}
}

// TestAgainstTheShop places 100 orders at a high rate on the real shop, with unknown SKUs,
// duplicates and cancellations, and checks the result against the orders database.
func TestAgainstTheShop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startShop(t)

	res, err := loadgen.Run(ctx, loadgen.Config{
		OrdersURL: s.ordersURL, Rate: 200, Concurrency: 8, Count: 100,
		UnknownSKUFraction: 0.1, DuplicateFraction: 0.2, CancelFraction: 0.2,
		RetryFor: 10 * time.Second, Seed: 1, KeyPrefix: "loadgen-test-",
	})
	require.NoError(t, err)
	t.Logf("\n%s", res.Summary())

	require.Empty(t, res.Errors, "a healthy shop answers every order as the API says")
	require.Equal(t, 100, res.Placed)
	require.Positive(t, res.RejectedByAPI, "unknown SKUs are refused")
	require.Equal(t, res.Placed, len(res.Acknowledged)+res.RejectedByAPI, "every other order is acknowledged")
	require.Positive(t, res.Duplicates)
	require.Equal(t, res.Duplicates, res.Replays, "every duplicate is a replay, and nothing else is")
	require.Positive(t, res.Cancelled)
	require.Positive(t, res.Latency.P50)
	require.LessOrEqual(t, res.Latency.P50, res.Latency.P99)

	// Every acknowledged order is in the database, under the key it was acknowledged for, and
	// nothing else is: the duplicates created nothing.
	ids := make([]string, 0, len(res.Acknowledged))
	for _, id := range res.Acknowledged {
		ids = append(ids, id)
	}
	var found, total int
	require.NoError(t, s.orders.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = ANY($1::uuid[])`, ids).Scan(&found))
	require.NoError(t, s.orders.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&total))
	require.Equal(t, len(ids), found, "every acknowledged order exists")
	require.Equal(t, len(ids), total, "one order per acknowledged key")

	rows, err := s.orders.Query(ctx, `SELECT key, order_id::text FROM idempotency_keys`)
	require.NoError(t, err)
	defer rows.Close()
	stored := map[string]string{}
	for rows.Next() {
		var key, id string
		require.NoError(t, rows.Scan(&key, &id))
		stored[key] = id
	}
	require.NoError(t, rows.Err())
	require.Equal(t, res.Acknowledged, stored, "the shop's idempotency keys name the same orders")
}

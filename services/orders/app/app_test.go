package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/metricstest"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders/app"
)

const orderBody = `{"customer_id": "c-42", "items": [{"sku": "BOOK-1", "quantity": 2}, {"sku": "PEN-1", "quantity": 1}]}`

// testConfig returns a configuration on a fresh database and a topology of the test's own,
// listening on 127.0.0.1:0, with short delays. The topology is deleted when the test ends.
func testConfig(t *testing.T) app.Config {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.DatabaseURL = testinfra.DatabaseURL(t)
	cfg.AMQPURL = testinfra.AMQPURL(t)
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.RelayHTTPAddr = "127.0.0.1:0"
	cfg.EventsExchange = testinfra.UniqueName(t, "ex")
	cfg.DeadLetterExchange = testinfra.UniqueName(t, "dlx")
	cfg.Queue = testinfra.UniqueName(t, "q")
	cfg.DeadLetterQueue = testinfra.UniqueName(t, "dq")
	cfg.RelayPollInterval = 100 * time.Millisecond
	cfg.ConsumerRetryBaseDelay = 10 * time.Millisecond
	cfg.ConsumerShutdownTimeout = 5 * time.Second
	cfg.HTTPShutdownTimeout = 5 * time.Second
	cfg.DatabaseTimeout = 2 * time.Second
	cfg.LogFormat = "text"
	t.Cleanup(func() { deleteTopology(t, cfg) })
	return cfg
}

func deleteTopology(t *testing.T, cfg app.Config) {
	withChannel(t, cfg.AMQPURL, func(ch *amqp.Channel) {
		for _, q := range []string{cfg.Queue, cfg.DeadLetterQueue} {
			_, err := ch.QueueDelete(q, false, false, false)
			require.NoError(t, err)
		}
		for _, ex := range []string{cfg.EventsExchange, cfg.DeadLetterExchange} {
			require.NoError(t, ch.ExchangeDelete(ex, false, false))
		}
	})
}

func withChannel(t *testing.T, amqpURL string, fn func(ch *amqp.Channel)) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	fn(ch)
}

// start runs an App in mode until the test ends.
func start(t *testing.T, cfg app.Config, mode app.Mode) *app.App {
	t.Helper()
	a, err := app.New(cfg, mode, app.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)).With("mode", mode)})
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop()) })
	return a
}

// listen binds a queue of the test's own to the events exchange with keys and returns a
// channel to read it with.
func listen(t *testing.T, cfg app.Config, keys ...string) (*amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(cfg.AMQPURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(cfg.EventsExchange, amqp.ExchangeTopic, true, false, false, false, nil))
	q := testinfra.UniqueName(t, "events")
	_, err = ch.QueueDeclare(q, false, false, true, false, nil) // exclusive: deleted with the connection
	require.NoError(t, err)
	for _, k := range keys {
		require.NoError(t, ch.QueueBind(q, k, cfg.EventsExchange, false, nil))
	}
	return ch, q
}

// next waits for the next message on q.
func next(t *testing.T, ch *amqp.Channel, q string) amqp.Delivery {
	t.Helper()
	var d amqp.Delivery
	testinfra.Eventually(t, 20*time.Second, func() bool {
		var ok bool
		var err error
		d, ok, err = ch.Get(q, true)
		require.NoError(t, err)
		return ok
	}, "a message on %s", q)
	return d
}

type response struct {
	status  int
	header  http.Header
	body    []byte
	problem problem.Details
}

func call(t *testing.T, method, url, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{status: resp.StatusCode, header: resp.Header, body: data}
	if resp.Header.Get("Content-Type") == problem.ContentType {
		require.NoError(t, json.Unmarshal(data, &r.problem))
	}
	return r
}

type orderJSON struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

func decodeOrder(t *testing.T, r response) orderJSON {
	t.Helper()
	var o orderJSON
	require.NoError(t, json.Unmarshal(r.body, &o), "body: %s", r.body)
	return o
}

// publishStock publishes a stock event as the warehouse would.
func publishStock(t *testing.T, cfg app.Config, msgID, typ, key, orderID, correlationID string) {
	t.Helper()
	withChannel(t, cfg.AMQPURL, func(ch *amqp.Channel) {
		require.NoError(t, ch.Confirm(false))
		returned := ch.NotifyReturn(make(chan amqp.Return, 1))
		// The service's consumer binds its queue after Start returned; until it has, the
		// broker returns the message (mandatory, NO_ROUTE) before confirming it: publish
		// again until it is routed.
		testinfra.Eventually(t, 20*time.Second, func() bool {
			c, err := ch.PublishWithDeferredConfirm(cfg.EventsExchange, key, true, false, amqp.Publishing{
				MessageId: msgID, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
				CorrelationId: correlationID,
				Body:          fmt.Appendf(nil, `{"version":1,"order_id":%q,"items":[]}`, orderID),
			})
			require.NoError(t, err)
			require.True(t, c.Wait())
			select {
			case <-returned:
				return false
			default:
				return true
			}
		}, "%s routed to a queue", typ)
	})
}

func waitStatus(t *testing.T, a *app.App, id, status string) {
	t.Helper()
	testinfra.Eventually(t, 20*time.Second, func() bool {
		return decodeOrder(t, call(t, http.MethodGet, a.URL()+"/orders/"+id, "")).Status == status
	}, "order %s %s", id, status)
}

// TestApp starts the whole service (API, relay and consumer in one process) and follows an
// order through the saga over the broker.
func TestApp(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ch, q := listen(t, cfg, "order.*")
	a := start(t, cfg, app.ModeAll)

	created := call(t, http.MethodPost, a.URL()+"/orders", orderBody, "X-Request-ID: req-e2e-1")
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	order := decodeOrder(t, created)

	// The relay publishes the outbox row: OrderCreated reaches a queue bound to the exchange.
	msg := next(t, ch, q)
	var outboxID uuid.UUID
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT id FROM outbox_messages WHERE aggregate_id = $1 AND type = 'OrderCreated'`, order.ID).Scan(&outboxID))
	require.Equal(t, outboxID.String(), msg.MessageId, "message id = outbox id")
	require.Equal(t, "OrderCreated", msg.Type)
	require.Equal(t, "order.created", msg.RoutingKey)
	require.Equal(t, "req-e2e-1", msg.CorrelationId, "correlation id = request id")
	require.Equal(t, "application/json", msg.ContentType)
	require.Equal(t, uint8(amqp.Persistent), msg.DeliveryMode)
	require.Equal(t, order.ID, msg.Headers["aggregate_id"])
	var body struct {
		Version    int    `json:"version"`
		OrderID    string `json:"order_id"`
		CustomerID string `json:"customer_id"`
		Items      []struct {
			SKU      string `json:"sku"`
			Quantity int    `json:"quantity"`
		} `json:"items"`
		CreatedAt time.Time `json:"created_at"`
	}
	require.NoError(t, json.Unmarshal(msg.Body, &body))
	require.Equal(t, 1, body.Version)
	require.Equal(t, order.ID, body.OrderID)
	require.Equal(t, "c-42", body.CustomerID)
	require.Len(t, body.Items, 2)
	require.False(t, body.CreatedAt.IsZero())

	// The warehouse answers; the consumer moves the order.
	publishStock(t, cfg, "wh-1", "StockReserved", "stock.reserved", order.ID, "req-e2e-1")
	waitStatus(t, a, order.ID, "RESERVED")

	cancelled := call(t, http.MethodPost, a.URL()+"/orders/"+order.ID+"/cancel", "", "X-Request-ID: req-e2e-2")
	require.Equal(t, http.StatusOK, cancelled.status, "body: %s", cancelled.body)
	require.Equal(t, "CANCELLING", decodeOrder(t, cancelled).Status)
	msg = next(t, ch, q)
	require.Equal(t, "OrderCancelled", msg.Type)
	require.Equal(t, "req-e2e-2", msg.CorrelationId)

	publishStock(t, cfg, "wh-2", "StockReleased", "stock.released", order.ID, "req-e2e-2")
	waitStatus(t, a, order.ID, "CANCELLED")
}

// TestAppSeparateProcesses runs the API and the relay as two Apps, as `orders api` and
// `orders relay` would.
func TestAppSeparateProcesses(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ch, q := listen(t, cfg, "order.created")
	api := start(t, cfg, app.ModeAPI)
	require.Empty(t, api.OpsAddr())

	created := call(t, http.MethodPost, api.URL()+"/orders", orderBody, "X-Request-ID: req-split")
	require.Equal(t, http.StatusCreated, created.status)

	relay := start(t, cfg, app.ModeRelay)
	require.Empty(t, relay.Addr(), "the relay serves no API")
	msg := next(t, ch, q)
	require.Equal(t, "OrderCreated", msg.Type)
	require.Equal(t, "req-split", msg.CorrelationId)

	ops := "http://" + relay.OpsAddr()
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, ops+"/healthz", "").status)
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, ops+"/readyz", "").status)
	metrics := call(t, http.MethodGet, ops+"/metrics", "")
	require.Equal(t, http.StatusOK, metrics.status)
	require.Contains(t, string(metrics.body), "go_goroutines")
	require.Contains(t, string(metrics.body), "process_")
	require.Equal(t, http.StatusNotFound, call(t, http.MethodGet, ops+"/orders/x", "").status)

	apiMetrics := call(t, http.MethodGet, api.URL()+"/metrics", "")
	require.Equal(t, http.StatusOK, apiMetrics.status)
	require.Contains(t, string(apiMetrics.body), "go_goroutines")

	// Each process exports the metrics of what it runs (docs/metrics.md); the backlog is
	// read by the API, so that it stays visible without a relay.
	_, relayFamilies := metricstest.Scrape(t, ops+"/metrics")
	_, apiFamilies := metricstest.Scrape(t, api.URL()+"/metrics")
	for _, name := range []string{"outbox_relay_state", "outbox_published_total", "pgxpool_total_conns", "http_requests_total"} {
		require.Contains(t, relayFamilies, name)
	}
	require.Contains(t, metricstest.LabelValues(relayFamilies, "http_requests_total", "route"), "/healthz")
	for _, name := range []string{"outbox_pending_messages", "inbox_messages_processed_total", "orders_created_total"} {
		require.NotContains(t, relayFamilies, name)
		require.Contains(t, apiFamilies, name)
	}
	require.NotContains(t, apiFamilies, "outbox_relay_state")
}

// TestAppOpsAddr gives an `orders all` process ORDERS_OPS_ADDR: /healthz, /readyz and
// /metrics answer there, the API on its own address, which keeps /healthz and /readyz for a
// health check of its port but answers /metrics 404, as any unknown route.
func TestAppOpsAddr(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.OpsAddr = "127.0.0.1:0"
	a := start(t, cfg, app.ModeAll)
	require.NotEmpty(t, a.OpsAddr())
	require.NotEqual(t, a.Addr(), a.OpsAddr())
	ops := "http://" + a.OpsAddr()

	created := call(t, http.MethodPost, a.URL()+"/orders", orderBody, "X-Request-ID: req-ops")
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	id := decodeOrder(t, created).ID
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, a.URL()+"/orders/"+id, "").status)

	require.Equal(t, http.StatusOK, call(t, http.MethodGet, ops+"/healthz", "").status)
	testinfra.Eventually(t, 20*time.Second, func() bool {
		return call(t, http.MethodGet, ops+"/readyz", "").status == http.StatusOK
	}, "ready on the operations address")
	_, families := metricstest.Scrape(t, ops+"/metrics")
	for _, name := range []string{"orders_created_total", "outbox_relay_state", "inbox_messages_processed_total", "http_requests_total", "go_goroutines"} {
		require.Contains(t, families, name)
	}
	require.Contains(t, metricstest.LabelValues(families, "http_requests_total", "route"), "/orders",
		"the API's requests are counted on the operations address")
	notAPI := call(t, http.MethodGet, ops+"/orders/"+id, "")
	require.Equal(t, http.StatusNotFound, notAPI.status, "the operations address serves no API")

	metrics := call(t, http.MethodGet, a.URL()+"/metrics", "")
	require.Equal(t, http.StatusNotFound, metrics.status, "no metrics on the API's address: body %s", metrics.body)
	require.Equal(t, problem.ContentType, metrics.header.Get("Content-Type"))
	require.Equal(t, problem.TypeNotFound, metrics.problem.Type)
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, a.URL()+"/healthz", "").status, "the API's port keeps its health check")
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, a.URL()+"/readyz", "").status)

	t.Run("ModeAPI", func(t *testing.T) {
		t.Parallel()
		api := start(t, cfg, app.ModeAPI)
		require.NotEmpty(t, api.OpsAddr())
		require.Equal(t, http.StatusOK, call(t, http.MethodGet, "http://"+api.OpsAddr()+"/metrics", "").status)
		require.Equal(t, http.StatusNotFound, call(t, http.MethodGet, api.URL()+"/metrics", "").status)
	})
	t.Run("ModeRelayKeepsItsAddress", func(t *testing.T) {
		t.Parallel()
		relayCfg := cfg
		relayCfg.OpsAddr = "127.0.0.1:1" // not bound: the relay serves on ORDERS_RELAY_HTTP_ADDR
		relay := start(t, relayCfg, app.ModeRelay)
		require.Empty(t, relay.Addr())
		require.NotEqual(t, "127.0.0.1:1", relay.OpsAddr())
		require.Equal(t, http.StatusOK, call(t, http.MethodGet, "http://"+relay.OpsAddr()+"/metrics", "").status)
	})
}

// TestAppDatabaseDown points the App at a proxy in front of PostgreSQL and cuts it.
func TestAppDatabaseDown(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	pgURL, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	proxy := testinfra.NewProxy(t, pgURL.Host)
	directURL := cfg.DatabaseURL
	cfg.DatabaseURL = proxy.RewriteURL(t, cfg.DatabaseURL)
	a := start(t, cfg, app.ModeAPI)

	// Ready once its consumer runs, a moment after the start on a loaded machine.
	testinfra.Eventually(t, 20*time.Second, func() bool {
		return call(t, http.MethodGet, a.URL()+"/readyz", "").status == http.StatusOK
	}, "ready")
	created := call(t, http.MethodPost, a.URL()+"/orders", orderBody)
	require.Equal(t, http.StatusCreated, created.status)
	id := decodeOrder(t, created).ID

	proxy.Cut()
	for name, r := range map[string]func() response{
		"Create": func() response { return call(t, http.MethodPost, a.URL()+"/orders", orderBody) },
		"CreateWithKey": func() response {
			return call(t, http.MethodPost, a.URL()+"/orders", orderBody, "Idempotency-Key: down")
		},
		"Get":    func() response { return call(t, http.MethodGet, a.URL()+"/orders/"+id, "") },
		"Cancel": func() response { return call(t, http.MethodPost, a.URL()+"/orders/"+id+"/cancel", "") },
		"Ready":  func() response { return call(t, http.MethodGet, a.URL()+"/readyz", "") },
	} {
		t.Run(name, func(t *testing.T) {
			resp := r()
			require.Equal(t, http.StatusServiceUnavailable, resp.status, "body: %s", resp.body)
			require.Equal(t, problem.ContentType, resp.header.Get("Content-Type"))
			require.Equal(t, http.StatusServiceUnavailable, resp.problem.Status)
			require.NotEmpty(t, resp.header.Get("Retry-After"))
		})
	}
	require.Equal(t, http.StatusOK, call(t, http.MethodGet, a.URL()+"/healthz", "").status, "alive while the database is away")

	proxy.Heal()
	testinfra.Eventually(t, 20*time.Second, func() bool {
		return call(t, http.MethodGet, a.URL()+"/readyz", "").status == http.StatusOK
	}, "ready again")
	require.Equal(t, http.StatusCreated, call(t, http.MethodPost, a.URL()+"/orders", orderBody, "Idempotency-Key: down").status)

	direct, err := pgx.Connect(context.Background(), directURL)
	require.NoError(t, err)
	defer direct.Close(context.Background())
	var orders, outbox int
	require.NoError(t, direct.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_messages)`).Scan(&orders, &outbox))
	require.Equal(t, 2, orders, "nothing was written while the database was away")
	require.Equal(t, 2, outbox)
}

func TestAppCreatesItsDatabase(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	u.Path += "_new" // a database that does not exist yet
	name := strings.TrimPrefix(u.Path, "/")
	cfg.DatabaseURL = u.String()
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), testinfra.PostgresURL(t))
		require.NoError(t, err)
		defer admin.Close(context.Background())
		_, err = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	require.NoError(t, app.Migrate(context.Background(), cfg, nil))
	require.NoError(t, app.Migrate(context.Background(), cfg, nil), "migrating again is a no-op")
	a := start(t, cfg, app.ModeAPI)
	require.Equal(t, http.StatusCreated, call(t, http.MethodPost, a.URL()+"/orders", orderBody).status)
}

func TestAppStartFails(t *testing.T) {
	t.Parallel()

	t.Run("BadMode", func(t *testing.T) {
		t.Parallel()
		_, err := app.New(app.DefaultConfig(), "everything", app.Options{})
		require.ErrorContains(t, err, "unknown mode")
	})
	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		cfg := app.DefaultConfig()
		cfg.RelayBatchSize = 0
		cfg.ConsumerConcurrency = 100
		_, err := app.New(cfg, app.ModeAll, app.Options{})
		require.ErrorContains(t, err, "ORDERS_RELAY_BATCH_SIZE")
		require.ErrorContains(t, err, "ORDERS_CONSUMER_CONCURRENCY")
	})
	t.Run("OpsAddrOnTheAPIsPort", func(t *testing.T) {
		t.Parallel()
		cfg := app.DefaultConfig()
		cfg.OpsAddr = cfg.HTTPAddr
		_, err := app.New(cfg, app.ModeAPI, app.Options{})
		require.ErrorContains(t, err, "ORDERS_OPS_ADDR (:8080) must differ from ORDERS_HTTP_ADDR (:8080)")
	})
	t.Run("OpsPortInUse", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		first := start(t, cfg, app.ModeAPI)
		cfg.OpsAddr = first.Addr()
		second, err := app.New(cfg, app.ModeAPI, app.Options{})
		require.NoError(t, err)
		require.ErrorContains(t, second.Start(context.Background()), "listen on "+first.Addr())
		require.NoError(t, second.Stop())
	})
	t.Run("PortInUse", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		first := start(t, cfg, app.ModeAPI)
		cfg.HTTPAddr = first.Addr()
		second, err := app.New(cfg, app.ModeAPI, app.Options{})
		require.NoError(t, err)
		require.ErrorContains(t, second.Start(context.Background()), "listen")
		require.NoError(t, second.Stop())
	})
}

func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	require.NoError(t, cfg.Validate())
	require.Equal(t, "postgres://postgres@127.0.0.1:5432/orders?sslmode=disable", cfg.DatabaseURL)
	require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", cfg.AMQPURL)
	require.Equal(t, "shop.events", cfg.EventsExchange)
	require.Equal(t, "shop.dlx", cfg.DeadLetterExchange)
	require.Equal(t, "orders.stock", cfg.Queue)
	require.Equal(t, "orders.stock.dead", cfg.DeadLetterQueue)
	require.Equal(t, 100, cfg.RelayBatchSize)
	require.Equal(t, time.Second, cfg.RelayPollInterval)
	require.Equal(t, ":8080", cfg.HTTPAddr)
	require.Equal(t, ":8081", cfg.RelayHTTPAddr)
	require.Empty(t, cfg.OpsAddr, "the API's listener serves the operations routes")
	require.Equal(t, 1, cfg.OrderCreatedVersion, "version 2 only once every consumer reads it")
}

// TestConfigFromFiles gives the URLs with their passwords as files (internal/envconfig), as a
// mounted Secret does.
func TestConfigFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbURL, amqpURL := filepath.Join(dir, "db-url"), filepath.Join(dir, "amqp-url")
	require.NoError(t, os.WriteFile(dbURL, []byte("postgres://orders:s3cret@db:5432/orders\n"), 0o600))
	require.NoError(t, os.WriteFile(amqpURL, []byte("amqp://orders:s3cret@mq:5672/"), 0o600))
	cfg, err := app.LoadConfigFrom(map[string]string{"ORDERS_DATABASE_URL_FILE": dbURL, "ORDERS_AMQP_URL_FILE": amqpURL})
	require.NoError(t, err)
	require.Equal(t, "postgres://orders:s3cret@db:5432/orders", cfg.DatabaseURL)
	require.Equal(t, "amqp://orders:s3cret@mq:5672/", cfg.AMQPURL)

	_, err = app.LoadConfigFrom(map[string]string{"ORDERS_DATABASE_URL_FILE": filepath.Join(dir, "missing")})
	require.ErrorContains(t, err, "ORDERS_DATABASE_URL_FILE: cannot read "+filepath.Join(dir, "missing"))
	_, err = app.LoadConfigFrom(map[string]string{"ORDERS_DATABASE_URL": "postgres://db/orders", "ORDERS_DATABASE_URL_FILE": dbURL})
	require.ErrorContains(t, err, "ORDERS_DATABASE_URL and ORDERS_DATABASE_URL_FILE are both set")
	require.NotContains(t, err.Error(), "s3cret")
}

func TestOrderCreatedVersionConfig(t *testing.T) {
	t.Parallel()
	cfg, err := app.LoadConfigFrom(map[string]string{"ORDERS_ORDER_CREATED_VERSION": "2"})
	require.NoError(t, err)
	require.Equal(t, 2, cfg.OrderCreatedVersion)
	for _, v := range []string{"0", "3", "two"} {
		_, err := app.LoadConfigFrom(map[string]string{"ORDERS_ORDER_CREATED_VERSION": v})
		require.ErrorContains(t, err, "ORDERS_ORDER_CREATED_VERSION", v)
	}
}

func TestLoadConfig(t *testing.T) { // not parallel: it sets environment variables
	t.Setenv("ORDERS_RELAY_BATCH_SIZE", "7")
	t.Setenv("ORDERS_RELAY_POLL_INTERVAL", "250ms")
	t.Setenv("ORDERS_QUEUE", "custom.queue")
	cfg, err := app.LoadConfig()
	require.NoError(t, err)
	require.Equal(t, 7, cfg.RelayBatchSize)
	require.Equal(t, 250*time.Millisecond, cfg.RelayPollInterval)
	require.Equal(t, "custom.queue", cfg.Queue)
	require.Equal(t, "shop.events", cfg.EventsExchange)

	t.Setenv("RELAY_BATCH_SIZE", "3") // unprefixed: not the orders service's
	t.Setenv("HTTP_ADDR", ":9999")
	cfg, err = app.LoadConfig()
	require.NoError(t, err)
	require.Equal(t, 7, cfg.RelayBatchSize)
	require.Equal(t, ":8080", cfg.HTTPAddr)
	t.Setenv("ORDERS_HTTP_ADDR", ":18080")
	t.Setenv("ORDERS_DATABASE_URL", "postgres://db/orders")
	t.Setenv("ORDERS_AMQP_URL", "amqp://mq/")
	cfg, err = app.LoadConfig()
	require.NoError(t, err)
	require.Equal(t, ":18080", cfg.HTTPAddr)
	require.Equal(t, "postgres://db/orders", cfg.DatabaseURL)
	require.Equal(t, "amqp://mq/", cfg.AMQPURL)
	require.Equal(t, []string{"amqp://mq/"}, cfg.AMQPURLs())
	t.Setenv("ORDERS_AMQP_URL", "amqp://u:p%2Cq@mq-0:5672/, amqp://u:p%2Cq@mq-1:5672/")
	t.Setenv("ORDERS_QUEUE_REPLICAS", "3")
	cfg, err = app.LoadConfig()
	require.NoError(t, err)
	require.Equal(t, []string{"amqp://u:p%2Cq@mq-0:5672/", "amqp://u:p%2Cq@mq-1:5672/"}, cfg.AMQPURLs())
	require.Equal(t, 3, cfg.QueueReplicas)
	t.Setenv("ORDERS_AMQP_URL", "amqp://u:p,q@mq-0:5672/")
	_, err = app.LoadConfig()
	require.ErrorContains(t, err, "ORDERS_AMQP_URL: URL 1 of 2")
	require.ErrorContains(t, err, "%2C")
	t.Setenv("ORDERS_AMQP_URL", "amqp://mq/")
	t.Setenv("ORDERS_QUEUE_REPLICAS", "-1")
	_, err = app.LoadConfig()
	require.ErrorContains(t, err, "ORDERS_QUEUE_REPLICAS")
	t.Setenv("ORDERS_QUEUE_REPLICAS", "0")

	t.Setenv("ORDERS_RELAY_POLL_INTERVAL", "soon")
	_, err = app.LoadConfig()
	require.ErrorContains(t, err, "ORDERS_RELAY_POLL_INTERVAL")
	t.Setenv("ORDERS_RELAY_POLL_INTERVAL", "1s")
	t.Setenv("ORDERS_RELAY_BATCH_SIZE", "-1")
	_, err = app.LoadConfig()
	require.ErrorContains(t, err, "ORDERS_RELAY_BATCH_SIZE")
}

// TestConfigVariablesArePrefixed keeps every variable of the orders service under ORDERS_, so
// that it runs from one shell with the warehouse (WAREHOUSE_…).
func TestConfigVariablesArePrefixed(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[app.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		require.True(t, strings.HasPrefix(name, "ORDERS_"), "%s reads %q", f.Name, name)
	}
}

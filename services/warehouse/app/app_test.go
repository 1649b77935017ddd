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
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/metricstest"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

// testAdminToken is the admin token of testConfig, which put sends.
const testAdminToken = "app-test-admin-token-5d2e8b7c"

// testConfig is a configuration on a database, exchanges and queues of the test's own, with
// listeners on free ports and short timings.
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
	cfg.DeadLetterQueue = testinfra.UniqueName(t, "dlq")
	cfg.RelayPollInterval = 100 * time.Millisecond
	cfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.AdminToken = testAdminToken
	t.Cleanup(func() { deleteTopology(t, cfg) })
	return cfg
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// start starts the app and stops it when the test ends, checking that it stopped cleanly.
func start(t *testing.T, cfg app.Config, mode app.Mode) *app.App {
	t.Helper()
	a, err := startApp(context.Background(), cfg, mode, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Stop()) })
	return a
}

// channel opens a confirming channel for the test.
func channel(t *testing.T, amqpURL string) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	return ch
}

func deleteTopology(t *testing.T, cfg app.Config) {
	conn, err := amqp091.Dial(cfg.AMQPURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{cfg.Queue, cfg.DeadLetterQueue} {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	for _, ex := range []string{cfg.EventsExchange, cfg.DeadLetterExchange} {
		require.NoError(t, ch.ExchangeDelete(ex, false, false))
	}
}

// stockQueue declares a queue of the test's own bound to stock.# on the events exchange, as
// the orders service's queue is, and returns its deliveries.
func stockQueue(t *testing.T, ch *amqp091.Channel, cfg app.Config) <-chan amqp091.Delivery {
	t.Helper()
	require.NoError(t, ch.ExchangeDeclare(cfg.EventsExchange, amqp091.ExchangeTopic, true, false, false, false, nil))
	q, err := ch.QueueDeclare(testinfra.UniqueName(t, "stock"), false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "stock.#", cfg.EventsExchange, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return deliveries
}

// publishOrderCreated publishes an OrderCreated as the orders service's relay does.
func publishOrderCreated(t *testing.T, ch *amqp091.Channel, cfg app.Config, orderID uuid.UUID, lines ...warehouse.Line) (messageID string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"version": 1, "order_id": orderID, "customer_id": "c-42", "items": lines, "created_at": time.Now().UTC(),
	})
	require.NoError(t, err)
	messageID = uuid.Must(uuid.NewV7()).String()
	conf, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), cfg.EventsExchange, warehouse.RoutingKeyOrderCreated, true, false,
		amqp091.Publishing{
			MessageId:     messageID,
			Type:          warehouse.TypeOrderCreated,
			ContentType:   "application/json",
			DeliveryMode:  amqp091.Persistent,
			Timestamp:     time.Now(),
			CorrelationId: "req-e2e",
			Headers: amqp091.Table{
				"correlation_id": "req-e2e", "aggregate_type": "order", "aggregate_id": orderID.String(),
			},
			Body: body,
		})
	require.NoError(t, err)
	ok, err := conf.WaitContext(context.Background())
	require.NoError(t, err)
	require.True(t, ok)
	return messageID
}

func get(t *testing.T, rawURL string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, rawURL, nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name  string
		modes []app.Mode
	}{
		{"in one process (all)", []app.Mode{app.ModeAll}},
		{"as api and relay processes", []app.Mode{app.ModeAPI, app.ModeRelay}},
	} {
		t.Run("an OrderCreated on the broker comes back as StockReserved "+tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			ch := channel(t, cfg.AMQPURL)
			stock := stockQueue(t, ch, cfg)
			var api *app.App
			for _, m := range tc.modes {
				a := start(t, cfg, m)
				if m != app.ModeRelay {
					api = a
				}
			}
			testinfra.Eventually(t, 20*time.Second, api.Consuming, "the consumer is consuming (its queue is declared)")

			orderID := uuid.Must(uuid.NewV7())
			messageID := publishOrderCreated(t, ch, cfg, orderID, warehouse.Line{SKU: "BOOK-1", Quantity: 2})

			var d amqp091.Delivery
			select {
			case d = <-stock:
			case <-time.After(30 * time.Second):
				t.Fatal("no message on the stock.# queue within 30s")
			}
			require.Equal(t, warehouse.TypeStockReserved, d.Type)
			require.Equal(t, warehouse.RoutingKeyStockReserved, d.RoutingKey)
			require.Equal(t, "application/json", d.ContentType)
			require.Equal(t, amqp091.Persistent, d.DeliveryMode)
			require.Equal(t, "req-e2e", d.CorrelationId)
			require.Equal(t, messageID, d.Headers["causation_id"])
			require.Equal(t, "req-e2e", d.Headers["correlation_id"])
			require.Equal(t, "order", d.Headers["aggregate_type"])
			require.Equal(t, orderID.String(), d.Headers["aggregate_id"])
			_, err := uuid.Parse(d.MessageId)
			require.NoError(t, err)
			var ev warehouse.StockReserved
			require.NoError(t, json.Unmarshal(d.Body, &ev))
			require.Equal(t, int64(1), ev.Version)
			require.Equal(t, orderID, ev.OrderID)
			require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}}, ev.Items)

			base := "http://" + api.HTTPAddr()
			status, body := get(t, base+"/reservations/"+orderID.String())
			require.Equal(t, http.StatusOK, status, body)
			require.Contains(t, body, `"status":"RESERVED"`)
			status, body = get(t, base+"/stock/BOOK-1")
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, body, `"available":98`)
			require.Contains(t, body, `"reserved":2`)
		})
	}
}

func TestModes(t *testing.T) {
	t.Parallel()

	t.Run("relay serves /healthz, /readyz and /metrics on its own port, and no API", func(t *testing.T) {
		t.Parallel()
		a := start(t, testConfig(t), app.ModeRelay)
		require.Equal(t, a.HTTPAddr(), a.OpsAddr())
		base := "http://" + a.HTTPAddr()
		status, _ := get(t, base+"/healthz")
		require.Equal(t, http.StatusOK, status)
		status, body := get(t, base+"/readyz")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, `"relay":`)
		require.NotContains(t, body, `"consumer":`, "a relay process runs no consumer")
		status, body = get(t, base+"/metrics")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "go_goroutines")
		require.Contains(t, body, "process_")
		status, _ = get(t, base+"/stock")
		require.Equal(t, http.StatusNotFound, status)

		// The relay's metrics, not the API's (docs/metrics.md).
		_, families := metricstest.Scrape(t, base+"/metrics")
		for _, name := range []string{"outbox_relay_state", "outbox_published_total", "pgxpool_total_conns", "http_requests_total"} {
			require.Contains(t, families, name)
		}
		require.Contains(t, metricstest.LabelValues(families, "http_requests_total", "route"), "/healthz")
		for _, name := range []string{"outbox_pending_messages", "inbox_messages_processed_total", "warehouse_stock_available", "warehouse_reservations_total"} {
			require.NotContains(t, families, name)
		}
	})

	t.Run("api reports its consumer on /readyz and serves /metrics", func(t *testing.T) {
		t.Parallel()
		a := start(t, testConfig(t), app.ModeAPI)
		require.Empty(t, a.OpsAddr(), "the API's listener serves the operations routes")
		testinfra.Eventually(t, 20*time.Second, a.Consuming, "consuming")
		status, body := get(t, "http://"+a.HTTPAddr()+"/readyz")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, `"consumer":"up"`)
		require.Contains(t, body, `"database":"up"`)
		status, body = get(t, "http://"+a.HTTPAddr()+"/metrics")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "go_goroutines")

		// The API's metrics, with the outbox backlog, and not the relay's. The stock gauge is
		// read in the background once the app started: wait for its first read.
		var families metricstest.Families
		testinfra.Eventually(t, 20*time.Second, func() bool {
			_, families = metricstest.Scrape(t, "http://"+a.HTTPAddr()+"/metrics")
			_, ok := families["warehouse_stock_available"]
			return ok
		}, "warehouse_stock_available exported")
		for _, name := range []string{"outbox_pending_messages", "inbox_retention_seconds", "warehouse_stock_available",
			"warehouse_reservations_total", "warehouse_releases_total", "pgxpool_max_conns", "http_requests_total"} {
			require.Contains(t, families, name)
		}
		require.NotContains(t, families, "outbox_relay_state")
	})

	t.Run("WAREHOUSE_OPS_ADDR serves /healthz, /readyz and /metrics, and the API's address no /metrics", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.OpsAddr = "127.0.0.1:0"
		a := start(t, cfg, app.ModeAll)
		require.NotEmpty(t, a.OpsAddr())
		require.NotEqual(t, a.HTTPAddr(), a.OpsAddr())
		api, ops := "http://"+a.HTTPAddr(), "http://"+a.OpsAddr()

		status, body := get(t, api+"/stock/BOOK-1")
		require.Equal(t, http.StatusOK, status, body)
		status, _ = get(t, ops+"/stock/BOOK-1")
		require.Equal(t, http.StatusNotFound, status, "the operations address serves no API")

		status, _ = get(t, ops+"/healthz")
		require.Equal(t, http.StatusOK, status)
		testinfra.Eventually(t, 20*time.Second, func() bool {
			status, body = get(t, ops+"/readyz")
			return status == http.StatusOK
		}, "ready on the operations address")
		require.Contains(t, body, `"consumer":"up"`)
		require.Contains(t, body, `"relay":`)
		require.Contains(t, body, `"database":"up"`)
		_, families := metricstest.Scrape(t, ops+"/metrics")
		for _, name := range []string{"outbox_relay_state", "outbox_pending_messages", "inbox_retention_seconds", "http_requests_total", "go_goroutines"} {
			require.Contains(t, families, name)
		}
		require.Contains(t, metricstest.LabelValues(families, "http_requests_total", "route"), "/stock/{sku}",
			"the API's requests are counted on the operations address")

		// The API's address keeps the probes, for a health check of its port, but not /metrics:
		// a 404 problem, as any unknown route.
		status, _ = get(t, api+"/healthz")
		require.Equal(t, http.StatusOK, status)
		status, _ = get(t, api+"/readyz")
		require.Equal(t, http.StatusOK, status)
		res, err := http.Get(api + "/metrics")
		require.NoError(t, err)
		defer res.Body.Close()
		var p problem.Details
		require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
		require.Equal(t, http.StatusNotFound, res.StatusCode)
		require.Equal(t, problem.ContentType, res.Header.Get("Content-Type"))
		require.Equal(t, problem.TypeNotFound, p.Type)
	})

	t.Run("creates its database when it does not exist", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		u, err := url.Parse(cfg.DatabaseURL)
		require.NoError(t, err)
		name := strings.TrimPrefix(u.Path, "/") + "_new"
		if len(name) > 63 {
			name = name[len(name)-63:]
		}
		u.Path = "/" + name
		cfg.DatabaseURL = u.String()
		t.Cleanup(func() { dropDatabase(t, name) })
		require.NoError(t, app.Migrate(context.Background(), cfg, testLogger(t)))
		changes, err := app.Seed(context.Background(), cfg, false, testLogger(t))
		require.NoError(t, err)
		require.Empty(t, changes, "a fresh database has the catalogue already")
	})

	t.Run("refuses an unknown mode and a bad configuration", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		_, err := startApp(context.Background(), cfg, "dance", nil)
		require.ErrorContains(t, err, `unknown mode "dance"`)
		cfg.ConsumerConcurrency = 0
		_, err = startApp(context.Background(), cfg, app.ModeAPI, nil)
		require.ErrorContains(t, err, "WAREHOUSE_CONSUMER_CONCURRENCY")
	})

	t.Run("fails to start when its operations port is taken", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		a := start(t, cfg, app.ModeAPI)
		cfg.OpsAddr = a.HTTPAddr()
		_, err := startApp(context.Background(), cfg, app.ModeAPI, nil)
		require.ErrorContains(t, err, "listen on "+a.HTTPAddr())
	})

	t.Run("fails to start when its port is taken", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		a := start(t, cfg, app.ModeAPI)
		cfg.HTTPAddr = a.HTTPAddr()
		_, err := startApp(context.Background(), cfg, app.ModeAPI, nil)
		require.ErrorContains(t, err, "listen on")
	})
}

func dropDatabase(t *testing.T, name string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testinfra.PostgresURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	require.NoError(t, err)
}

func TestConfig(t *testing.T) {
	t.Parallel()

	t.Run("defaults work on a developer machine", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfigFrom(map[string]string{})
		require.NoError(t, err)
		require.Equal(t, app.DefaultConfig(), cfg)
		require.Equal(t, "postgres://postgres@127.0.0.1:5432/warehouse?sslmode=disable", cfg.DatabaseURL)
		require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", cfg.AMQPURL)
		require.Equal(t, "shop.events", cfg.EventsExchange)
		require.Equal(t, "warehouse.orders", cfg.Queue)
	})

	t.Run("environment variables override the defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfigFrom(map[string]string{
			"WAREHOUSE_HTTP_ADDR":            ":1234",
			"WAREHOUSE_CONSUMER_RETRY_DELAY": "2s",
			"WAREHOUSE_QUEUE":                "wh.q",
		})
		require.NoError(t, err)
		require.Equal(t, ":1234", cfg.HTTPAddr)
		require.Equal(t, 2*time.Second, cfg.ConsumerRetryBaseDelay)
		require.Equal(t, "wh.q", cfg.Topology().Queue)
	})

	t.Run("bad values are refused with the variable's name", func(t *testing.T) {
		t.Parallel()
		_, err := app.LoadConfigFrom(map[string]string{"WAREHOUSE_CONSUMER_RETRY_DELAY": "soon"})
		require.ErrorContains(t, err, "WAREHOUSE_CONSUMER_RETRY_DELAY")
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_RELAY_BATCH_SIZE": "0"})
		require.ErrorContains(t, err, "WAREHOUSE_RELAY_BATCH_SIZE")
		// A small prefetch with the other consumer settings left alone is fine (the
		// library's AckEvery follows it); batches and acks beyond it are not.
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_CONSUMER_PREFETCH": "2", "WAREHOUSE_CONSUMER_CONCURRENCY": "2"})
		require.NoError(t, err)
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_CONSUMER_PREFETCH": "4", "WAREHOUSE_CONSUMER_CONCURRENCY": "2",
			"WAREHOUSE_CONSUMER_BATCH_SIZE": "8", "WAREHOUSE_CONSUMER_ACK_EVERY": "5"})
		require.ErrorContains(t, err, "WAREHOUSE_CONSUMER_BATCH_SIZE (8) must be from 1 to WAREHOUSE_CONSUMER_PREFETCH (4)")
		require.ErrorContains(t, err, "WAREHOUSE_CONSUMER_ACK_EVERY (5) must be from 0")
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_CONSUMER_PREFETCH": "64", "WAREHOUSE_CONSUMER_CONCURRENCY": "1",
			"WAREHOUSE_CONSUMER_BATCH_SIZE": "33"})
		require.ErrorContains(t, err, "WAREHOUSE_CONSUMER_BATCH_SIZE must be at most 32")
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_CONSUMER_PREFETCH": "64", "WAREHOUSE_CONSUMER_CONCURRENCY": "2",
			"WAREHOUSE_CONSUMER_BATCH_SIZE": "32"})
		require.NoError(t, err)
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_OPS_ADDR": ":8090"})
		require.ErrorContains(t, err, "WAREHOUSE_OPS_ADDR (:8090) must differ from WAREHOUSE_HTTP_ADDR (:8090)")
		cfg, err := app.LoadConfigFrom(map[string]string{"WAREHOUSE_OPS_ADDR": ":9090"})
		require.NoError(t, err)
		require.Equal(t, ":9090", cfg.OpsAddr)
		require.Empty(t, app.DefaultConfig().OpsAddr, "the API's listener serves the operations routes")
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_QUEUE": ""})
		require.NoError(t, err, "an empty variable is unset")
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_AMQP_URL": "amqp://a:5672/,http://b/"})
		require.ErrorContains(t, err, "WAREHOUSE_AMQP_URL: URL 2 of 2")
	})

	t.Run("the URLs given as files", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		dbURL := filepath.Join(dir, "db-url")
		require.NoError(t, os.WriteFile(dbURL, []byte("postgres://warehouse:s3cret@db:5432/warehouse\n"), 0o600))
		cfg, err := app.LoadConfigFrom(map[string]string{"WAREHOUSE_DATABASE_URL_FILE": dbURL})
		require.NoError(t, err)
		require.Equal(t, "postgres://warehouse:s3cret@db:5432/warehouse", cfg.DatabaseURL)
		_, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_AMQP_URL_FILE": filepath.Join(dir, "missing")})
		require.ErrorContains(t, err, "WAREHOUSE_AMQP_URL_FILE: cannot read "+filepath.Join(dir, "missing"))
	})

	t.Run("the versions of OrderCreated read", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []int{1, 2}, app.DefaultConfig().OrderCreatedVersions)
		cfg, err := app.LoadConfigFrom(map[string]string{"WAREHOUSE_ORDER_CREATED_VERSIONS": "1"})
		require.NoError(t, err)
		require.Equal(t, []int{1}, cfg.OrderCreatedVersions)
		for value, want := range map[string]string{
			"3":   "WAREHOUSE_ORDER_CREATED_VERSIONS: this warehouse reads versions [1 2] of OrderCreated, not 3",
			"1,1": "WAREHOUSE_ORDER_CREATED_VERSIONS names version 1 twice",
			"v2":  "WAREHOUSE_ORDER_CREATED_VERSIONS",
		} {
			_, err := app.LoadConfigFrom(map[string]string{"WAREHOUSE_ORDER_CREATED_VERSIONS": value})
			require.ErrorContains(t, err, want, value)
		}
	})

	t.Run("the admin token, from its variable or a file", func(t *testing.T) {
		t.Parallel()
		const token = "config-test-admin-token-1234"
		cfg, err := app.LoadConfigFrom(map[string]string{})
		require.NoError(t, err)
		resolved, err := cfg.ResolveAdminToken()
		require.NoError(t, err)
		require.Empty(t, resolved.Reveal(), "none by default: the admin API is disabled")

		cfg, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_ADMIN_TOKEN": token})
		require.NoError(t, err)
		resolved, err = cfg.ResolveAdminToken()
		require.NoError(t, err)
		require.Equal(t, token, resolved.Reveal())
		require.NotContains(t, fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg), token, "a printed Config shows no token")

		dir := t.TempDir()
		file := filepath.Join(dir, "admin-token")
		require.NoError(t, os.WriteFile(file, []byte(token+"\n"), 0o600))
		cfg, err = app.LoadConfigFrom(map[string]string{"WAREHOUSE_ADMIN_TOKEN_FILE": file})
		require.NoError(t, err)
		resolved, err = cfg.ResolveAdminToken()
		require.NoError(t, err)
		require.Equal(t, token, resolved.Reveal(), "the file's content, its trailing newline trimmed")

		short := filepath.Join(dir, "short")
		require.NoError(t, os.WriteFile(short, []byte("tiny-token\n"), 0o600))
		empty := filepath.Join(dir, "empty")
		require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
		missing := filepath.Join(dir, "missing")
		for _, tc := range []struct {
			env  map[string]string
			want string
		}{
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN": token, "WAREHOUSE_ADMIN_TOKEN_FILE": file},
				"WAREHOUSE_ADMIN_TOKEN and WAREHOUSE_ADMIN_TOKEN_FILE are both set"},
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN": "tiny-token"}, "WAREHOUSE_ADMIN_TOKEN must be at least 16 bytes long, is 10"},
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN": "has spaces in the middle"}, "WAREHOUSE_ADMIN_TOKEN must be letters, digits"},
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN_FILE": short}, "WAREHOUSE_ADMIN_TOKEN_FILE: the token in " + short + " must be at least 16 bytes long"},
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN_FILE": empty}, "WAREHOUSE_ADMIN_TOKEN_FILE: " + empty + " is empty"},
			{map[string]string{"WAREHOUSE_ADMIN_TOKEN_FILE": missing}, "WAREHOUSE_ADMIN_TOKEN_FILE: cannot read " + missing},
		} {
			_, err := app.LoadConfigFrom(tc.env)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), token)
			require.NotContains(t, err.Error(), "tiny-token", "an error never quotes a token")
			cfg := app.DefaultConfig()
			cfg.AdminToken, cfg.AdminTokenFile = envconfig.Secret(tc.env["WAREHOUSE_ADMIN_TOKEN"]), tc.env["WAREHOUSE_ADMIN_TOKEN_FILE"]
			_, err = app.New(cfg, app.ModeAPI, app.Options{})
			require.ErrorContains(t, err, tc.want, "a start-up error")
		}
	})

	t.Run("a cluster's nodes and replicas", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfigFrom(map[string]string{
			"WAREHOUSE_AMQP_URL":       "amqp://mq-0:5672/,amqp://mq-1:5672/,amqp://mq-2:5672/",
			"WAREHOUSE_QUEUE_REPLICAS": "3",
		})
		require.NoError(t, err)
		require.Equal(t, []string{"amqp://mq-0:5672/", "amqp://mq-1:5672/", "amqp://mq-2:5672/"}, cfg.AMQPURLs())
		require.Equal(t, 3, cfg.Topology().Replicas)
	})
}

// startApp makes an App and starts it: app.New, then App.Start.
func startApp(ctx context.Context, cfg app.Config, mode app.Mode, log *slog.Logger) (*app.App, error) {
	a, err := app.New(cfg, mode, app.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// runApp makes an App and runs it until ctx ends: app.New, then App.Run.
func runApp(ctx context.Context, cfg app.Config, mode app.Mode, log *slog.Logger) error {
	a, err := app.New(cfg, mode, app.Options{Logger: log})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

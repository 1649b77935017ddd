package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/orders/app"
)

// logBuffer collects an App's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// proxied points cfg's database and broker at proxies of their own, which the test cuts.
func proxied(t *testing.T, cfg *app.Config) (db, broker *testinfra.Proxy) {
	t.Helper()
	pg, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	mq, err := url.Parse(cfg.AMQPURL)
	require.NoError(t, err)
	db, broker = testinfra.NewProxy(t, pg.Host), testinfra.NewProxy(t, mq.Host)
	cfg.DatabaseURL = db.RewriteURL(t, cfg.DatabaseURL)
	cfg.AMQPURL = broker.RewriteURL(t, cfg.AMQPURL)
	return db, broker
}

// readyz answers /readyz of the process: its status and its checks.
func readyz(t *testing.T, base string) (int, map[string]string) {
	t.Helper()
	resp := call(t, http.MethodGet, base+"/readyz", "")
	var body struct {
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.Unmarshal(resp.body, &body), "body: %s", resp.body)
	return resp.status, body.Checks
}

// waitReady waits until /readyz answers status with the checks named in down down and the
// others up.
func waitReady(t *testing.T, base string, status int, want map[string]string) {
	t.Helper()
	var (
		got    int
		checks map[string]string
	)
	testinfra.Eventually(t, 30*time.Second, func() bool {
		got, checks = readyz(t, base)
		if got != status || len(checks) != len(want) {
			return false
		}
		for name, state := range want {
			if !strings.HasPrefix(checks[name], state) {
				return false
			}
		}
		return true
	}, "/readyz %d %v (last: %d %v)", status, want, got, checks)
}

// TestAppReadiness takes each dependency away from each kind of process and checks that
// /readyz says so, dependency by dependency, and recovers.
func TestAppReadiness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   app.Mode
		broker []string // the checks that fail without the broker
	}{
		{app.ModeAPI, []string{"consumer"}},
		{app.ModeRelay, []string{"relay"}},
		{app.ModeAll, []string{"consumer", "relay"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			direct := cfg.DatabaseURL
			cfg.BrokerDownGrace = 300 * time.Millisecond
			db, broker := proxied(t, &cfg)
			a := start(t, cfg, tc.mode)
			base := a.URL()
			if tc.mode == app.ModeRelay {
				base = "http://" + a.OpsAddr()
			}
			up := map[string]string{"database": "up"}
			for _, name := range tc.broker {
				up[name] = "up"
			}
			waitReady(t, base, http.StatusOK, up)

			// The broker goes away. A relay notices it with the next message it publishes.
			broker.Cut()
			if tc.mode != app.ModeAPI {
				addOutboxRow(t, direct, cfg.EventsExchange)
			}
			down := map[string]string{"database": "up"}
			for _, name := range tc.broker {
				down[name] = "down: "
			}
			waitReady(t, base, http.StatusServiceUnavailable, down)
			resp := call(t, http.MethodGet, base+"/readyz", "")
			require.NotEmpty(t, resp.header.Get("Retry-After"))
			for _, name := range tc.broker {
				require.Contains(t, resp.problem.Detail, name+": ")
			}
			broker.Heal()
			waitReady(t, base, http.StatusOK, up)

			// The database goes away.
			db.Cut()
			testinfra.Eventually(t, 30*time.Second, func() bool {
				status, checks := readyz(t, base)
				return status == http.StatusServiceUnavailable && strings.HasPrefix(checks["database"], "down: ")
			}, "/readyz 503 without the database")
			db.Heal()
			waitReady(t, base, http.StatusOK, up)
		})
	}
}

// addOutboxRow writes a message to the outbox for the relay to publish.
func addOutboxRow(t *testing.T, dbURL, exchange string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, outbox.Add(context.Background(), conn, outbox.Message{
		ID: uuid.Must(uuid.NewV7()), Exchange: exchange, RoutingKey: "order.created", Type: "OrderCreated",
		AggregateType: "order", AggregateID: uuid.NewString(), Payload: []byte(`{}`),
	}))
}

// TestAppWaitsForTheDatabase starts the service while its database cannot be reached: it
// waits, logging the wait once, and starts once the database is there.
func TestAppWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	db, _ := proxied(t, &cfg)
	db.Cut()
	logs := &logBuffer{}
	a, err := app.New(cfg, app.ModeAll, app.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- a.Start(context.Background()) }()
	t.Cleanup(func() { require.NoError(t, a.Stop()) })

	// Several attempts (each dials twice: the connection and pgx's cancel request), and
	// one line about them.
	testinfra.Eventually(t, 20*time.Second, func() bool { return db.Dials() >= 6 }, "Start keeps trying")
	require.Equal(t, 1, logs.count("open database: failing"), "the wait is logged once")
	select {
	case err := <-started:
		t.Fatalf("Start returned while the database was away: %v", err)
	default:
	}
	db.Heal()
	select {
	case err := <-started:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return once the database was back")
	}
	require.Equal(t, http.StatusCreated, call(t, http.MethodPost, a.URL()+"/orders", orderBody).status)
	require.Zero(t, logs.count("level=ERROR"))
}

// TestAppStopWhileWaitingForTheDatabase stops a service that still waits for its database:
// a graceful stop, not a failure.
func TestAppStopWhileWaitingForTheDatabase(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	db, _ := proxied(t, &cfg)
	db.Cut()
	logs := &logBuffer{}
	a, err := app.New(cfg, app.ModeAPI, app.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	testinfra.Eventually(t, 20*time.Second, func() bool { return logs.count("open database: failing") >= 1 },
		"waiting for the database")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when stopped")
	}
}

// TestAppQueueDeclaredWithOtherArguments starts the service on a queue declared with another
// delivery limit (ORDERS_QUEUE_DELIVERY_LIMIT changed): it keeps the queue, warns once, and
// consumes.
func TestAppQueueDeclaredWithOtherArguments(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	withChannel(t, cfg.AMQPURL, func(ch *amqp.Channel) {
		require.NoError(t, ch.ExchangeDeclare(cfg.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil))
		_, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(7),
			"x-dead-letter-exchange": cfg.DeadLetterExchange, "x-dead-letter-routing-key": cfg.Queue,
		})
		require.NoError(t, err)
	})
	cfg.QueueDeliveryLimit = 20
	logs := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			logs.mu.Lock()
			t.Log(logs.buf.String())
			logs.mu.Unlock()
		}
	})
	a, err := app.New(cfg, app.ModeAll, app.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop()) })

	created := call(t, http.MethodPost, a.URL()+"/orders", orderBody)
	require.Equal(t, http.StatusCreated, created.status)
	order := decodeOrder(t, created)
	// Start returns before the consumer has declared its bindings; a stock event published
	// before that would be unroutable. /readyz cannot tell: within BrokerDownGrace a consumer
	// not connected yet counts as up. The consumer logs "consuming" once Setup (the bindings)
	// is done and it consumes.
	waitReady(t, a.URL(), http.StatusOK, map[string]string{"database": "up", "consumer": "up", "relay": "up"})
	testinfra.Eventually(t, 30*time.Second, func() bool { return logs.count("msg=consuming") >= 1 },
		"the consumer consumes, its bindings declared")
	publishStock(t, cfg, "wh-args-1", "StockReserved", "stock.reserved", order.ID, "req-args")
	waitStatus(t, a, order.ID, "RESERVED")
	require.Equal(t, 1, logs.count("queue exists with other arguments than configured"),
		"one warning, though the consumer and the relay both declared")
}

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
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

// logBuffer collects an app's log lines.
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

// readyz answers the process's /readyz: its status and its checks.
func readyz(t *testing.T, base string) (int, map[string]string) {
	t.Helper()
	status, body := get(t, base+"/readyz")
	var v struct {
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	return status, v.Checks
}

// waitReady waits until /readyz answers status with exactly the checks of want, each
// starting with its state ("up", "down: ").
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

// TestReadiness takes each dependency away from each kind of process and checks that
// /readyz says so, dependency by dependency, and recovers.
func TestReadiness(t *testing.T) {
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
			base := "http://" + a.HTTPAddr()
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

// addOutboxRow writes an answer to the outbox for the relay to publish.
func addOutboxRow(t *testing.T, dbURL, exchange string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, outbox.Add(context.Background(), conn, outbox.Message{
		ID: uuid.Must(uuid.NewV7()), Exchange: exchange, RoutingKey: warehouse.RoutingKeyStockReserved, Type: warehouse.TypeStockReserved,
		AggregateType: warehouse.AggregateType, AggregateID: uuid.NewString(), Payload: []byte(`{}`),
	}))
}

// TestStartWaitsForTheDatabase starts the warehouse while its database cannot be reached: it
// waits, logging the wait once, and starts once the database is there; stopped while it
// waits, it stops without an error.
func TestStartWaitsForTheDatabase(t *testing.T) {
	t.Parallel()

	t.Run("starts once the database is there", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		db, _ := proxied(t, &cfg)
		db.Cut()
		logs := &logBuffer{}
		type result struct {
			a   *app.App
			err error
		}
		started := make(chan result, 1)
		go func() {
			a, err := startApp(context.Background(), cfg, app.ModeAll, slog.New(slog.NewTextHandler(logs, nil)))
			started <- result{a, err}
		}()
		// Several attempts (each dials twice: the connection and pgx's cancel request), and
		// one line about them.
		testinfra.Eventually(t, 20*time.Second, func() bool { return db.Dials() >= 6 }, "Start keeps trying")
		require.Equal(t, 1, logs.count("open database: failing"), "the wait is logged once")
		select {
		case r := <-started:
			t.Fatalf("Start returned while the database was away: %v", r.err)
		default:
		}
		db.Heal()
		var r result
		select {
		case r = <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("Start did not return once the database was back")
		}
		require.NoError(t, r.err)
		t.Cleanup(func() { require.NoError(t, r.a.Stop()) })
		status, body := get(t, "http://"+r.a.HTTPAddr()+"/stock/BOOK-1")
		require.Equal(t, http.StatusOK, status, body)
		require.Zero(t, logs.count("level=ERROR"))
	})

	t.Run("stops without an error while it waits", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		db, _ := proxied(t, &cfg)
		db.Cut()
		logs := &logBuffer{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- runApp(ctx, cfg, app.ModeAPI, slog.New(slog.NewTextHandler(logs, nil))) }()
		testinfra.Eventually(t, 20*time.Second, func() bool { return logs.count("open database: failing") >= 1 },
			"waiting for the database")
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return when stopped")
		}
	})
}

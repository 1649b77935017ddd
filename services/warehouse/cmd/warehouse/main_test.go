package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

// run is the binary's main with the test's arguments, environment and output.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr *syncBuffer) int {
	return app.Command().Run(ctx, args, environ, stdout, stderr)
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// environ is a configuration on a database and broker names of the test's own.
func environ(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{
		"WAREHOUSE_DATABASE_URL":         testinfra.DatabaseURL(t),
		"WAREHOUSE_AMQP_URL":             testinfra.AMQPURL(t),
		"WAREHOUSE_HTTP_ADDR":            "127.0.0.1:0",
		"WAREHOUSE_RELAY_HTTP_ADDR":      "127.0.0.1:0",
		"WAREHOUSE_EVENTS_EXCHANGE":      testinfra.UniqueName(t, "ex"),
		"WAREHOUSE_DEAD_LETTER_EXCHANGE": testinfra.UniqueName(t, "dlx"),
		"WAREHOUSE_QUEUE":                testinfra.UniqueName(t, "q"),
		"WAREHOUSE_DEAD_LETTER_QUEUE":    testinfra.UniqueName(t, "dlq"),
		"WAREHOUSE_LOG_FORMAT":           "text",
	}
}

func TestRun(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string
	}{
		{name: "no command is a usage error", args: nil, code: 2, stderr: "usage: warehouse"},
		{name: "help prints the usage", args: []string{"help"}, code: 0, stdout: "seed [--force]"},
		{name: "an unknown command is a usage error", args: []string{"dance"}, code: 2, stderr: `unknown command "dance"`},
		{name: "a command that takes no arguments refuses some", args: []string{"api", "relay"}, code: 2, stderr: "takes no arguments"},
		{name: "a bad variable fails with its name", args: []string{"migrate"}, env: map[string]string{"WAREHOUSE_LOG_LEVEL": "loud"}, code: 1, stderr: "loud"},
		{name: "an invalid setting fails", args: []string{"api"}, env: map[string]string{"WAREHOUSE_CONSUMER_CONCURRENCY": "0"}, code: 1, stderr: "WAREHOUSE_CONSUMER_CONCURRENCY"},
		{name: "an unknown seed flag is a usage error", args: []string{"seed", "--bogus"}, code: 2, stderr: "flag provided but not defined"},
		{name: "an operations address on the API's port fails naming both", args: []string{"api"}, env: map[string]string{"WAREHOUSE_OPS_ADDR": ":8090"},
			code: 1, stderr: "WAREHOUSE_OPS_ADDR (:8090) must differ from WAREHOUSE_HTTP_ADDR (:8090)"},
		{name: "bad crash points fail with their variable", args: []string{"api"}, env: map[string]string{"CHAOS_FAILPOINTS": "x=boom"}, code: 1, stdout: "CHAOS_FAILPOINTS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr syncBuffer
			require.Equal(t, tc.code, run(context.Background(), tc.args, tc.env, &stdout, &stderr))
			require.Contains(t, stdout.String(), tc.stdout)
			require.Contains(t, stderr.String(), tc.stderr)
		})
	}

	t.Run("migrate, then seed, which refuses while stock is reserved unless forced", func(t *testing.T) {
		t.Parallel()
		env := environ(t)
		var stdout, stderr syncBuffer
		require.Equal(t, 0, run(context.Background(), []string{"migrate"}, env, &stdout, &stderr), stderr.String())
		require.Contains(t, stdout.String(), "database migrated")

		ctx := context.Background()
		conn, err := pgx.Connect(ctx, env["WAREHOUSE_DATABASE_URL"])
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `
INSERT INTO reservations (order_id, status, created_message_id, created_at, updated_at)
VALUES ('0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d', 'RESERVED', 'm1', now(), now());
INSERT INTO reservation_lines VALUES ('0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d', 'BAG-1', 4);
INSERT INTO stock_movements (sku, delta, kind, order_id) VALUES ('BAG-1', -4, 'reserve', '0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d');
UPDATE stock SET available = 6 WHERE sku = 'BAG-1'`)
		require.NoError(t, err)

		stdout, stderr = syncBuffer{}, syncBuffer{}
		require.Equal(t, 1, run(ctx, []string{"seed"}, env, &stdout, &stderr))
		require.Contains(t, stderr.String(), "--force")

		stdout, stderr = syncBuffer{}, syncBuffer{}
		require.Equal(t, 0, run(ctx, []string{"seed", "--force"}, env, &stdout, &stderr), stderr.String())
		require.Contains(t, stdout.String(), "BAG-1: 6 -> 10")
		require.Contains(t, stdout.String(), "seeded 5 SKUs (1 changed)")
	})

	t.Run("all runs until its context ends, then exits 0", func(t *testing.T) {
		t.Parallel()
		env := environ(t)
		env["WAREHOUSE_OPS_ADDR"] = "127.0.0.1:0"
		t.Cleanup(func() { deleteTopology(t, env) })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stdout, stderr syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"all"}, env, &stdout, &stderr) }()
		testinfra.Eventually(t, 30*time.Second, func() bool { return strings.Contains(stdout.String(), "consuming") },
			"the consumer started; output so far:\n%s", &stdout)
		cancel()
		require.Equal(t, 0, <-done, stderr.String())
		require.Contains(t, stdout.String(), "ops_addr=127.0.0.1:", "the operations listener of WAREHOUSE_OPS_ADDR")
		require.Contains(t, stdout.String(), "warehouse stopped")
	})
}

// deleteTopology removes the queues and exchanges named in env.
func deleteTopology(t *testing.T, env map[string]string) {
	conn, err := amqp091.Dial(env["WAREHOUSE_AMQP_URL"])
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{env["WAREHOUSE_QUEUE"], env["WAREHOUSE_DEAD_LETTER_QUEUE"]} {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	for _, ex := range []string{env["WAREHOUSE_EVENTS_EXCHANGE"], env["WAREHOUSE_DEAD_LETTER_EXCHANGE"]} {
		require.NoError(t, ch.ExchangeDelete(ex, false, false))
	}
}

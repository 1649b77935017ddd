package outbox_test

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
)

// outageLength is how long the tests below keep the database away: long enough for a loop
// without a delay to try thousands of times, and for the backoff to reach its cap.
const outageLength = 3 * time.Second

// outage is a database behind a proxy that a test cuts for outageLength, and a pool through
// the proxy that counts the calls made of it: each call the code under test makes while the
// database is cut is one attempt that fails.
type outage struct {
	proxy *testinfra.Proxy
	pool  *pgxpool.Pool // through the proxy
	db    *countingDB   // pool, counted
}

func newOutage(t *testing.T, b *bundle) *outage {
	t.Helper()
	proxy := testinfra.NewProxy(t, hostPort(t, b.pool.Config().ConnString()))
	pool, err := pgxpool.New(context.Background(), proxy.RewriteURL(t, b.pool.Config().ConnString()))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &outage{proxy: proxy, pool: pool, db: &countingDB{Pool: pool}}
}

// run cuts the database for outageLength, heals it, and returns the calls made of the pool
// meanwhile, by method, and how long the cut really lasted.
func (o *outage) run(t *testing.T, during func()) (calls map[string]int64, lasted time.Duration) {
	t.Helper()
	before, dials := o.db.snapshot(), o.proxy.Dials()
	start := time.Now()
	o.proxy.Cut()
	during()
	// The point of the test is an outage of this length; what happens in it is counted after.
	time.Sleep(outageLength - time.Since(start))
	after, lasted := o.db.snapshot(), time.Since(start)
	calls = map[string]int64{}
	for m, n := range after {
		calls[m] = n - before[m]
	}
	t.Logf("a %s outage: calls %v, %d connections opened (and refused)", lasted.Round(time.Millisecond), calls, o.proxy.Dials()-dials)
	o.proxy.Heal()
	return calls, lasted
}

// countingDB is a pool that counts the calls made of it.
type countingDB struct {
	*pgxpool.Pool
	mu    sync.Mutex
	calls map[string]int64
}

func (c *countingDB) count(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int64{}
	}
	c.calls[method]++
}

func (c *countingDB) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.calls)
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.count("Begin")
	return c.Pool.Begin(ctx)
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.count("Exec")
	return c.Pool.Exec(ctx, sql, args...)
}

func (c *countingDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	c.count("Acquire")
	return c.Pool.Acquire(ctx)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.count("Query")
	return c.Pool.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.count("QueryRow")
	return c.Pool.QueryRow(ctx, sql, args...)
}

// requireStreakLines requires one line entering the failure streak of what, none "still
// failing" (the outage is shorter than the log interval), and one recovery line.
func requireStreakLines(t *testing.T, logs *testinfra.Logs, what string) {
	t.Helper()
	require.Equal(t, 1, logs.Count(slog.LevelWarn, what+": failing"), "%s: one line when it starts failing\n%s", what, logs.String(slog.LevelDebug))
	require.Zero(t, logs.Count(slog.LevelWarn, what+": still failing"), "%s: no repeat within the log interval\n%s", what, logs.String(slog.LevelDebug))
	testinfra.Eventually(t, waitFor, func() bool { return logs.Count(slog.LevelInfo, what+": recovered") == 1 },
		"%s: one line when it recovers\n%s", what, logs.String(slog.LevelDebug))
}

// TestLoopsBackOff cuts the database under every background loop of the module for a few
// seconds and counts what each loop did meanwhile: its attempts (the connections it opened,
// each refused by the cut) must stay within what its backoff allows, and it must say the
// failure once, and the recovery once. A loop that retried without delay would open
// thousands of connections, and log as many lines.
func TestLoopsBackOff(t *testing.T) {
	t.Parallel()

	t.Run("Relay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := newOutage(t, b)
		got := consume(t, b.amqpURL, b.top.Queue)
		logger, logs := testinfra.NewLogs(t)
		cfg := fastConfig(t)
		cfg.Logger = logger
		cfg.OutageBaseDelay, cfg.OutageMaxDelay = 100*time.Millisecond, time.Second
		r := b.startRelay(t, db.db, b.pub, cfg)
		b.write(t, b.msg("a", 1))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "published before the outage")

		calls, lasted := db.run(t, func() {
			testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateDatabaseUnavailable }, "relay paused")
		})
		// Three loops reach the database, each through a method of its own: the cycles
		// (Begin), the maintenance passes (Exec) and the LISTEN connection (Acquire). Each may
		// have had one attempt under way when the cut came.
		backoff := retry.Backoff{Base: cfg.OutageBaseDelay, Max: cfg.OutageMaxDelay}
		allowed := int64(backoff.MaxAttempts(lasted) + 1)
		for _, method := range []string{"Begin", "Exec", "Acquire"} {
			require.LessOrEqual(t, calls[method], allowed, "%s: the relay's loop retried faster than its backoff\n%s", method, logs.String(slog.LevelDebug))
		}
		require.Positive(t, calls["Begin"])
		require.Positive(t, calls["Exec"])

		b.write(t, b.msg("a", 2))
		defer func() {
			if t.Failed() {
				rows, _ := b.pool.Query(context.Background(), "SELECT seq, waiting, attempts, next_attempt_at - now(), last_error, published_at IS NOT NULL FROM outbox_messages ORDER BY seq")
				for rows.Next() {
					v, _ := rows.Values()
					t.Log(v...)
				}
				rows, _ = b.pool.Query(context.Background(), "SELECT pid, state, xact_start, left(query, 60) FROM pg_stat_activity WHERE datname = current_database()")
				for rows.Next() {
					v, _ := rows.Values()
					t.Log(v...)
				}
				t.Log(logs.String(slog.LevelDebug))
			}
		}()
		testinfra.Eventually(t, waitFor, func() bool { return got.len() >= 2 }, "published after the outage")
		for _, what := range []string{"outbox relay", "outbox relay: maintenance pass", "outbox relay: LISTEN connection (polling meanwhile)"} {
			requireStreakLines(t, logs, what)
		}
		require.Equal(t, 3, logs.Count(slog.LevelWarn, ""), "the outage said once per loop, nothing else\n%s", logs.String(slog.LevelDebug))
	})

	periodic := []struct {
		name, what string
		run        func(ctx context.Context, db outbox.DBTX, log *slog.Logger, interval time.Duration) error
	}{
		{"Cleanup", "outbox cleanup", func(ctx context.Context, db outbox.DBTX, log *slog.Logger, interval time.Duration) error {
			return outbox.RunCleanup(ctx, db, outbox.CleanupConfig{Interval: interval, Logger: log})
		}},
		{"Stats", "outbox stats", func(ctx context.Context, db outbox.DBTX, log *slog.Logger, interval time.Duration) error {
			s, err := outboxmetrics.NewStats(prometheus.NewRegistry(), db, outboxmetrics.StatsConfig{Interval: interval, Logger: log})
			if err != nil {
				return err
			}
			return s.Run(ctx)
		}},
	}
	for _, p := range periodic {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			db := newOutage(t, b)
			logger, logs := testinfra.NewLogs(t)
			// An interval longer than the outage: the retries come from the backoff alone. The
			// loop starts in the outage, so its first run fails.
			const interval = time.Minute
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			t.Cleanup(func() {
				cancel()
				require.NoError(t, <-done)
			})
			calls, lasted := db.run(t, func() {
				go func() { done <- p.run(ctx, db.db, logger, interval) }()
			})
			attempts := calls["QueryRow"] + calls["Query"] + calls["Exec"]
			backoff := retry.Backoff{Base: outbox.DefaultOutageBaseDelay, Max: outbox.DefaultOutageMaxDelay}
			require.LessOrEqual(t, attempts, int64(backoff.MaxAttempts(lasted)), "%s retried faster than its backoff\n%s", p.what, logs.String(slog.LevelDebug))
			require.GreaterOrEqual(t, attempts, int64(3), "%s retried within the outage, not only at its interval", p.what)
			requireStreakLines(t, logs, p.what)
			for _, r := range logs.Records() {
				require.True(t, r.Level < slog.LevelWarn || strings.HasPrefix(r.Msg, p.what+": "), "unexpected line %q", r.Msg)
			}
		})
	}
}

package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// countingExecer counts the runs of Cleanup on it: each run first reads how the table is
// laid out, once, whether or not the database answers.
type countingExecer struct {
	inbox.Execer
	queries atomic.Int64
}

func (c *countingExecer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "relkind") {
		c.queries.Add(1)
	}
	return c.Execer.QueryRow(ctx, sql, args...)
}

func (c *countingExecer) runs() int { return int(c.queries.Load()) }

// insertProcessed adds n inbox rows processed age ago, with ids prefix-0 … prefix-(n-1).
func insertProcessed(t *testing.T, pool *pgxpool.Pool, prefix string, n int, age time.Duration) {
	t.Helper()
	for i := range n {
		_, err := pool.Exec(context.Background(), `INSERT INTO inbox_messages (consumer, message_id, message_type, received_at, processed_at)
			VALUES ('billing', $1, 'order.placed', now() - make_interval(secs => $2), now() - make_interval(secs => $2))`,
			fmt.Sprintf("%s-%d", prefix, i), age.Seconds())
		require.NoError(t, err)
	}
}

func TestCleanup(t *testing.T) {
	t.Parallel()

	t.Run("RemovesOnlyOldRowsInBatches", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := newMigratedPool(t)
		insertProcessed(t, pool, "old", 5, 48*time.Hour)
		insertProcessed(t, pool, "new", 3, time.Minute)
		logs := &recordHandler{}

		deleted, err := inbox.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 24 * time.Hour, BatchSize: 2, Logger: slog.New(logs)})
		require.NoError(t, err)
		require.EqualValues(t, 5, deleted)
		require.Equal(t, []int64{2, 2, 1}, logs.int64Attrs("inbox cleanup batch", "deleted"), "batches")
		require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM inbox_messages WHERE message_id LIKE 'new-%'`))
		require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))

		deleted, err = inbox.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 24 * time.Hour, BatchSize: 2})
		require.NoError(t, err)
		require.Zero(t, deleted)
	})

	t.Run("DeletedMessageIsNoLongerADuplicate", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := newMigratedPool(t)
		insertProcessed(t, pool, "old", 1, 48*time.Hour)

		_, err := inbox.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 24 * time.Hour})
		require.NoError(t, err)
		// This is why the retention must exceed the redelivery window.
		dup, err := inbox.Process(ctx, pool, "billing", inbox.Message{ID: "old-0"}, nil)
		require.NoError(t, err)
		require.False(t, dup)
	})

	t.Run("ZeroMeansTheDefaults", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := newMigratedPool(t)
		insertProcessed(t, pool, "expired", 3, inbox.DefaultCleanupRetention+time.Hour)
		insertProcessed(t, pool, "kept", 2, inbox.DefaultCleanupRetention-time.Hour)

		deleted, err := inbox.Cleanup(ctx, pool, inbox.CleanupConfig{})
		require.NoError(t, err)
		require.EqualValues(t, 3, deleted)
		require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM inbox_messages WHERE message_id LIKE 'kept-%'`))
		require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("RejectsInvalidConfig", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background() // outlives this function: the subtests run in parallel after it
		pool := newMigratedPool(t)
		insertProcessed(t, pool, "old", 1, 48*time.Hour)

		for name, cfg := range map[string]inbox.CleanupConfig{
			"NegativeRetention": {Retention: -time.Hour},
			"NegativeBatchSize": {Retention: time.Hour, BatchSize: -1},
			"NegativeInterval":  {Retention: time.Hour, Interval: -1},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				_, err := inbox.Cleanup(ctx, pool, cfg)
				require.Error(t, err)
				require.Error(t, inbox.RunCleanup(ctx, pool, cfg))
				require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM inbox_messages`), "an invalid config deleted rows")
			})
		}
	})

	t.Run("RunCleanupLoopsUntilCancelled", func(t *testing.T) {
		t.Parallel()
		pool := newMigratedPool(t)
		insertProcessed(t, pool, "first", 3, 48*time.Hour)
		insertProcessed(t, pool, "new", 2, time.Minute)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- inbox.RunCleanup(ctx, pool, inbox.CleanupConfig{Retention: 24 * time.Hour, BatchSize: 2, Interval: 20 * time.Millisecond})
		}()

		oldRows := func() bool {
			return countRows(t, pool, `SELECT count(*) FROM inbox_messages WHERE processed_at < now() - interval '1 day'`) == 0
		}
		testinfra.Eventually(t, 10*time.Second, oldRows, "first run left old rows")
		insertProcessed(t, pool, "second", 3, 48*time.Hour)
		testinfra.Eventually(t, 10*time.Second, oldRows, "a later run left old rows")
		require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))

		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("RunCleanup did not return after its context was cancelled")
		}
	})

	// The database goes away under RunCleanup for a few seconds: it retries with the outage
	// backoff, capped at the interval, logs the outage once when it starts and once when it
	// ends, and goes back to its interval. A loop that retried at once would make thousands
	// of runs in the cut, against the few dozen the backoff allows; one that logged every
	// failed run would write a warning per run, against the one allowed.
	t.Run("RunCleanupBacksOffThroughADatabaseOutage", func(t *testing.T) {
		t.Parallel()
		const (
			// Short, so that the loop runs during the cut; longer than the first waits of the
			// backoff, so that they show.
			interval = 500 * time.Millisecond
			cutFor   = 3 * time.Second
		)
		dbURL := testinfra.DatabaseURL(t)
		proxy := testinfra.NewProxy(t, hostPort(t, dbURL))
		pool, err := pgxpool.New(t.Context(), proxy.RewriteURL(t, dbURL))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		require.NoError(t, inbox.Migrate(t.Context(), pool))
		db := &countingExecer{Execer: pool}
		logger, logs := testinfra.NewLogs(t)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- inbox.RunCleanup(ctx, db, inbox.CleanupConfig{Interval: interval, Logger: logger}) }()
		testinfra.Eventually(t, 10*time.Second, func() bool { return db.runs() >= 2 }, "RunCleanup did not run twice")
		require.Zero(t, logs.Count(slog.LevelWarn, ""), "%s", logs.String(slog.LevelDebug))

		before := db.runs()
		cutAt := time.Now()
		proxy.Cut()
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return time.Since(cutAt) >= cutFor && logs.Count(slog.LevelWarn, "inbox cleanup: failing") == 1
		}, "RunCleanup did not fail during the cut")
		runs, cut := db.runs()-before, time.Since(cutAt)
		proxy.Heal()
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return logs.Count(slog.LevelInfo, "inbox cleanup: recovered") == 1
		}, "RunCleanup did not recover after the cut")
		cancel()
		require.NoError(t, <-done)

		// The waits after failures are the outage backoff's, each at most the interval.
		backoff := retry.Backoff{Base: inbox.DefaultOutageBaseDelay, Max: min(inbox.DefaultOutageMaxDelay, interval)}
		t.Logf("cut for %s: %d runs (at most %d), lines:\n%s", cut.Round(time.Millisecond), runs, backoff.MaxAttempts(cut),
			logs.String(slog.LevelInfo))
		require.Greater(t, runs, 1, "RunCleanup did not retry during the cut")
		// Slack 1: the run under way when the proxy was cut.
		require.LessOrEqual(t, runs, backoff.MaxAttempts(cut)+1, "more runs than the backoff allows")
		require.LessOrEqual(t, logs.Count(slog.LevelWarn, ""), 1+int(cut/retry.DefaultLogInterval), "%s", logs.String(slog.LevelWarn))
		require.Equal(t, 1, logs.Count(slog.LevelInfo, "recovered"), "%s", logs.String(slog.LevelInfo))
	})
}

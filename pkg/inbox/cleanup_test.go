package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

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
}

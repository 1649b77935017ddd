package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	var old, recent []outbox.Message
	for i := range 7 {
		old = append(old, b.write(t, b.msg("old", i))...)
	}
	for i := range 3 {
		recent = append(recent, b.write(t, b.msg("recent", i))...)
	}
	pending := b.write(t, b.msg("pending", 1))
	deadOld := b.write(t, b.msg("dead", 1))
	_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - interval '10 days' WHERE id = ANY($1)", ids(old))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - interval '1 hour' WHERE id = ANY($1)", ids(recent))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET dead_at = now() - interval '30 days' WHERE id = $1", deadOld[0].ID)
	require.NoError(t, err)

	n, err := outbox.Cleanup(ctx, b.pool, outbox.CleanupConfig{Retention: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.EqualValues(t, 7, n, "old published rows deleted, in batches of 2")
	require.Equal(t, 5, b.count(t, "true"))
	require.Equal(t, 3, b.count(t, "published_at IS NOT NULL"), "recent published rows kept")
	require.Equal(t, 1, b.count(t, "published_at IS NULL AND dead_at IS NULL"), "pending row kept")
	require.Equal(t, 1, b.count(t, "dead_at IS NOT NULL"), "dead row kept for the operator")
	require.Equal(t, 1, b.count(t, "id = '"+pending[0].ID.String()+"'"))

	for name, cfg := range map[string]outbox.CleanupConfig{
		"NegativeRetention": {Retention: -time.Hour},
		"NegativeBatchSize": {BatchSize: -1},
		"NegativeInterval":  {Interval: -1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := outbox.Cleanup(ctx, b.pool, cfg)
			require.Error(t, err)
			require.Error(t, outbox.RunCleanup(ctx, b.pool, cfg))
			require.Equal(t, 5, b.count(t, "true"), "an invalid config deleted rows")
		})
	}

	t.Run("ZeroMeansTheDefaults", func(t *testing.T) {
		_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - $1::interval WHERE id = $2",
			outbox.DefaultCleanupRetention+time.Hour, recent[0].ID)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - $1::interval WHERE id = $2",
			outbox.DefaultCleanupRetention-time.Hour, recent[1].ID)
		require.NoError(t, err)
		n, err := outbox.Cleanup(ctx, b.pool, outbox.CleanupConfig{})
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "only the row published more than DefaultCleanupRetention ago")
		require.Equal(t, 4, b.count(t, "true"))
	})

	t.Run("RunCleanupStopsOnCancel", func(t *testing.T) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- outbox.RunCleanup(runCtx, b.pool, outbox.CleanupConfig{Retention: time.Minute, Interval: 10 * time.Millisecond})
		}()
		_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - interval '2 minutes' WHERE published_at IS NOT NULL")
		require.NoError(t, err)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 0 }, "periodic cleanup ran")
		cancel()
		require.NoError(t, <-done)
	})
}

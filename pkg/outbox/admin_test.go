package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	s, err := outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, s, "empty outbox")

	msgs := b.write(t, b.msg("a", 1), b.msg("b", 1), b.msg("c", 1))
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() WHERE id = $1", msgs[0].ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET dead_at = now() WHERE id = $1", msgs[1].ID)
	require.NoError(t, err)
	s, err = outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Pending)
	require.EqualValues(t, 1, s.Dead)
	require.WithinDuration(t, time.Now(), s.OldestPending, time.Minute)
}

func TestDeadRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	got := consume(t, b.amqpURL, b.top.Queue)

	msgs := b.write(t, b.msg("a", 1), b.msg("b", 1))
	_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET dead_at = now(), attempts = 10, last_error = 'nacked' WHERE id = $1", msgs[0].ID)
	require.NoError(t, err)

	dead, err := outbox.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, msgs[0].ID, dead[0].ID)
	require.Equal(t, "nacked", dead[0].LastError)
	require.Equal(t, 10, dead[0].Attempts)
	require.JSONEq(t, string(msgs[0].Payload), string(dead[0].Payload))

	_, err = outbox.ListDead(ctx, b.pool, 0)
	require.Error(t, err)

	b.startRelay(t, b.pool, b.pub, fastConfig(t))
	testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "live row published")

	n, err := outbox.Requeue(ctx, b.pool, msgs[0].ID, msgs[1].ID) // msgs[1] is not dead: ignored
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 2 }, "requeued row published")
	require.Equal(t, 1, got.ids()[msgs[0].ID.String()])
	require.Zero(t, b.count(t, "dead_at IS NOT NULL"))
}

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

	_, err = outbox.Cleanup(ctx, b.pool, outbox.CleanupConfig{Retention: -time.Hour})
	require.Error(t, err)

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

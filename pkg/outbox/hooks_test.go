package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// TestHooks holds the relay to what [outbox.Hooks] promises of a hook that panics or blocks.
func TestHooks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PanicUnwindsRun", func(t *testing.T) {
		// A hook runs on Run's goroutine: its panic comes out of Run, with the relay's own
		// goroutines stopped (goleak checks at the end) and its batch rolled back; Run may be
		// called again.
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		m := b.write(t, b.msg("hook-panic", 1))[0]
		var panicked atomic.Bool
		cfg := fastConfig(t)
		cfg.Hooks.Polled = func(p outbox.Poll) {
			if p.Claimed > 0 && panicked.CompareAndSwap(false, true) {
				panic("metrics exploded")
			}
		}
		r, err := outbox.NewRelay(b.pool, b.pub, cfg)
		require.NoError(t, err)
		recovered := make(chan any, 1)
		go func() {
			defer func() { recovered <- recover() }()
			_ = r.Run(ctx)
		}()
		require.Equal(t, "metrics exploded", <-recovered)
		require.Equal(t, 1, b.count(t, "published_at IS NULL AND attempts = 0"), "the batch was rolled back")

		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		testinfra.Eventually(t, waitFor, func() bool { return got.ids()[m.ID.String()] == 1 }, "published by Run again")
		cancel()
		require.NoError(t, <-done)
	})

	t.Run("BlockingPolledHoldsTheClaim", func(t *testing.T) {
		// Polled runs with the claim's transaction open: while it blocks, the relay
		// publishes nothing and the claimed rows stay locked (other relays skip them).
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		entered, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		cfg := fastConfig(t)
		cfg.Hooks.Polled = func(p outbox.Poll) {
			if p.Claimed > 0 && once.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
		}
		b.startRelay(t, b.pool, b.pub, cfg)
		m := b.write(t, b.msg("hook-block", 1))[0]
		<-entered
		var unlocked int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM outbox_messages
			WHERE published_at IS NULL FOR UPDATE SKIP LOCKED) l`).Scan(&unlocked))
		require.Zero(t, unlocked, "the claimed row is locked while the hook blocks")
		require.Zero(t, got.len(), "nothing is published while the hook blocks")
		close(release)
		testinfra.Eventually(t, waitFor, func() bool { return got.ids()[m.ID.String()] == 1 }, "published once the hook returned")
	})
}

package outboxtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
)

// runRelay runs a relay on b's outbox with pub until the test ends.
func (b *bundle) runRelay(t *testing.T, pub outbox.Publisher) {
	t.Helper()
	relay, err := outbox.NewRelay(b.pool, pub, outbox.Config{
		PollInterval:    20 * time.Millisecond,
		RetryBaseDelay:  time.Millisecond,
		RetryMaxDelay:   5 * time.Millisecond,
		OutageBaseDelay: time.Millisecond,
		OutageMaxDelay:  5 * time.Millisecond,
		MaxAttempts:     3,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func (b *bundle) add(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, msgs...) }))
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ConfirmsByDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := &outboxtest.Publisher{}
		b.runRelay(t, pub)
		b.add(t, created("o-1"), cancelled("o-1"), created("o-2"))
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got, err := pub.WaitPublished(waitCtx, 3)
		require.NoError(t, err)
		require.Len(t, got, 3)
		// One aggregate's messages arrive in the order they were added.
		var o1 []string
		for _, m := range got {
			if m.AggregateID == "o-1" {
				o1 = append(o1, m.Type)
			}
		}
		require.Equal(t, []string{"OrderCreated", "OrderCancelled"}, o1)
		testinfra.Eventually(t, 10*time.Second, func() bool {
			s, err := outbox.ReadStats(ctx, b.pool)
			return err == nil && s.Pending == 0
		}, "the relay marks the confirmed rows published")
	})

	t.Run("ScriptedOutcomes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := &outboxtest.Publisher{}
		// The first message: the broker is down (no attempt), then refused (no attempt), then
		// not sent (no attempt), then an ordinary failure (one attempt), then confirmed.
		pub.Script(
			outbox.ErrUnavailable,
			outbox.ErrRefused,
			outbox.ErrNotSent,
			errors.New("unroutable"),
		)
		b.runRelay(t, pub)
		b.add(t, created("o-1"))
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := pub.WaitPublished(waitCtx, 1)
		require.NoError(t, err)
		attempts := pub.Attempts()
		require.Len(t, attempts, 5)
		require.ErrorIs(t, attempts[0].Err, outbox.ErrUnavailable)
		require.NoError(t, attempts[4].Err)
		require.Equal(t, 1, attempts[4].Message.Attempts, "only the unroutable failure counted")
	})

	t.Run("PermanentKillsTheRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := &outboxtest.Publisher{Outcome: func(m outbox.Message) error {
			if m.AggregateID == "poison" {
				return outbox.Permanent(errors.New("content refused"))
			}
			return nil
		}}
		b.runRelay(t, pub)
		b.add(t, created("poison"), created("fine"))
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got, err := pub.WaitPublished(waitCtx, 1)
		require.NoError(t, err)
		require.Equal(t, "fine", got[0].AggregateID)
		testinfra.Eventually(t, 10*time.Second, func() bool {
			dead, err := outbox.ListDead(ctx, b.pool, 10)
			return err == nil && len(dead) == 1 && dead[0].Message.AggregateID == "poison"
		}, "the poison row is dead")
	})

	t.Run("CancelledContextSendsNothing", func(t *testing.T) {
		t.Parallel()
		pub := &outboxtest.Publisher{}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		errs := pub.Publish(cctx, []outbox.Message{created("o-1")})
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], outbox.ErrNotSent)
		require.ErrorIs(t, errs[0], context.Canceled)
		require.Empty(t, pub.Published())
		require.Len(t, pub.Attempts(), 1)
	})

	t.Run("InvalidMessageIsPermanent", func(t *testing.T) {
		t.Parallel()
		pub := &outboxtest.Publisher{}
		bad := created("o-1")
		bad.Type = ""
		errs := pub.Publish(ctx, []outbox.Message{bad, created("o-2")})
		require.True(t, outbox.IsPermanent(errs[0]))
		require.ErrorIs(t, errs[0], outbox.ErrInvalidMessage)
		require.NoError(t, errs[1])
	})

	t.Run("WaitPublishedGivesUp", func(t *testing.T) {
		t.Parallel()
		pub := &outboxtest.Publisher{}
		require.Empty(t, pub.Publish(ctx, nil))
		require.Empty(t, pub.Publish(ctx, []outbox.Message{created("o-1")})[0])
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		got, err := pub.WaitPublished(wctx, 2)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Len(t, got, 1)
	})
}

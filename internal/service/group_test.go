package service_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/internal/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// untilCancelled is a component that runs until it is asked to stop.
func untilCancelled(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func TestGroup(t *testing.T) {
	t.Parallel()

	t.Run("StopIsGracefulAndRunsCleanupsInReverse", func(t *testing.T) {
		t.Parallel()
		g := service.NewGroup("test", nil)
		var order []string
		var mu sync.Mutex
		note := func(s string) func() {
			return func() { mu.Lock(); order = append(order, s); mu.Unlock() }
		}
		g.OnStop(note("first registered"))
		g.OnStop(note("second registered"))
		g.Add("a", untilCancelled)
		g.Add("b", func(ctx context.Context) error { <-ctx.Done(); note("b returned")(); return nil })
		g.Start(context.Background())
		require.NoError(t, g.Stop())
		require.Equal(t, []string{"b returned", "second registered", "first registered"}, order)
		require.NoError(t, g.Stop(), "Stop again")
		select {
		case <-g.Done():
		default:
			t.Fatal("Done not closed after Stop")
		}
	})

	t.Run("FirstFailureStopsTheOthers", func(t *testing.T) {
		t.Parallel()
		var logs bytes.Buffer
		g := service.NewGroup("test", slog.New(slog.NewTextHandler(&logs, nil)))
		boom := errors.New("boom")
		g.Add("steady", untilCancelled)
		g.Add("broken", func(context.Context) error { return boom })
		g.Start(context.Background())
		select {
		case <-g.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a failed component did not stop the group")
		}
		require.ErrorIs(t, g.Wait(), boom)
		require.ErrorContains(t, g.Stop(), "broken: boom")
		require.Contains(t, logs.String(), "component=broken")
		require.Contains(t, logs.String(), "test stopped")
	})

	t.Run("ReturningEarlyIsAFailure", func(t *testing.T) {
		t.Parallel()
		g := service.NewGroup("test", nil)
		g.Add("steady", untilCancelled)
		g.Add("quitter", func(context.Context) error { return nil })
		g.Start(context.Background())
		require.ErrorIs(t, g.Wait(), service.ErrStoppedByItself)
	})

	t.Run("CancellingStartsContextStops", func(t *testing.T) {
		t.Parallel()
		g := service.NewGroup("test", nil)
		g.Add("steady", untilCancelled)
		ctx, cancel := context.WithCancel(context.Background())
		g.Start(ctx)
		cancel()
		require.NoError(t, g.Wait())
	})

	t.Run("StopBeforeStartReleasesResources", func(t *testing.T) {
		t.Parallel()
		g := service.NewGroup("test", nil)
		var released atomic.Bool
		g.OnStop(func() { released.Store(true) })
		g.Add("never run", func(context.Context) error { panic("ran") })
		require.NoError(t, g.Stop())
		require.True(t, released.Load())
		require.Panics(t, func() { g.Start(context.Background()) })
	})

	t.Run("AddAfterStartPanics", func(t *testing.T) {
		t.Parallel()
		g := service.NewGroup("test", nil)
		g.Add("steady", untilCancelled)
		g.Start(context.Background())
		require.Panics(t, func() { g.Add("late", untilCancelled) })
		require.NoError(t, g.Stop())
	})
}

func TestRedeliveryWindow(t *testing.T) {
	t.Parallel()
	retries := func(n int, delay, maxDelay time.Duration) service.ConsumerSettings {
		return service.ConsumerSettings{MaxDeliveries: n, RetryBaseDelay: delay, RetryMaxDelay: maxDelay}
	}
	require.Equal(t, time.Duration(0), service.RedeliveryWindow(retries(1, time.Second, time.Second), 1), "one attempt each: no retry, no window")
	require.Greater(t, service.RedeliveryWindow(retries(5, time.Second, 30*time.Second), 10),
		service.RedeliveryWindow(retries(5, time.Second, 30*time.Second), 1))
	require.Equal(t, service.RedeliveryWindow(retries(3, 2*time.Second, time.Second), 1),
		service.RedeliveryWindow(retries(3, 2*time.Second, 2*time.Second), 1), "a max below the delay is the delay")
}

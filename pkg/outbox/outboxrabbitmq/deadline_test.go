package outboxrabbitmq

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestGuard(t *testing.T) {
	t.Parallel()

	// setup returns a guard using one end of a pipe.
	setup := func(t *testing.T) (*guard, net.Conn) {
		t.Helper()
		client, server := net.Pipe()
		t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
		g := &guard{}
		g.use(client)
		return g, client
	}
	isOpen := func(c net.Conn) bool { return c.SetDeadline(time.Time{}) == nil }

	t.Run("ClosesTheSocketAtTheDeadline", func(t *testing.T) {
		t.Parallel()
		g, client := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		disarm := g.arm(ctx)
		require.False(t, g.hasFired())
		cancel()
		require.Eventually(t, g.hasFired, 10*time.Second, time.Millisecond)
		_, err := client.Write([]byte("x"))
		require.ErrorIs(t, err, io.ErrClosedPipe)
		require.True(t, disarm(), "the call learns the deadline closed its socket")
		require.False(t, g.hasFired(), "disarmed")
	})

	t.Run("ACallThatEndsInTimeClosesNothing", func(t *testing.T) {
		t.Parallel()
		g, client := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		disarm := g.arm(ctx)
		require.False(t, disarm())
		cancel() // after the call: the guard no longer watches it
		require.False(t, g.hasFired())
		require.True(t, isOpen(client))
	})

	t.Run("ALateFireOfAnEarlierCallClosesNothing", func(t *testing.T) {
		t.Parallel()
		g, client := setup(t)
		first := g.arm(context.Background())
		require.False(t, first())
		second := g.arm(context.Background())
		g.fire(1) // the first call's
		require.False(t, g.hasFired())
		require.True(t, isOpen(client))
		require.False(t, second())
	})

	t.Run("ASocketUsedAfterTheDeadlineIsClosedAtOnce", func(t *testing.T) {
		t.Parallel()
		g := &guard{}
		ctx, cancel := context.WithCancel(context.Background())
		disarm := g.arm(ctx)
		cancel()
		require.Eventually(t, g.hasFired, 10*time.Second, time.Millisecond)
		client, server := net.Pipe()
		t.Cleanup(func() { _ = server.Close() })
		g.use(client) // dialled while the deadline passed
		require.False(t, isOpen(client))
		require.True(t, disarm())
	})
}

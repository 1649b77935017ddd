package proxy_test

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/chaos/internal/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type bundle struct {
	proxy *proxy.Proxy
}

func setup(t *testing.T) bundle {
	t.Helper()
	p, err := proxy.Listen("127.0.0.1:0", echoServer(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return bundle{proxy: p}
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and reads the echo, within a deadline.
func roundTrip(c net.Conn, r *bufio.Reader, line string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestProxy(t *testing.T) {
	t.Parallel()

	t.Run("Forwards", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, r := dial(t, b.proxy.Addr())
		got, err := roundTrip(c, r, "hello")
		require.NoError(t, err)
		require.Equal(t, "hello", got)
		require.Equal(t, int64(1), b.proxy.Stats().Accepted)
		// 6 bytes each way; the echo can reach the client a moment before it is counted.
		require.Eventually(t, func() bool { return b.proxy.Stats().Bytes == 12 }, 3*time.Second, 10*time.Millisecond)
	})

	t.Run("CutDropsAndRefusesUntilHealed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, r := dial(t, b.proxy.Addr())
		_, err := roundTrip(c, r, "before")
		require.NoError(t, err)

		require.Equal(t, 1, b.proxy.Cut())
		_, err = roundTrip(c, r, "during")
		require.Error(t, err, "the open connection was dropped")

		c2, r2 := dial(t, b.proxy.Addr()) // the listener still accepts, then closes
		_, err = roundTrip(c2, r2, "refused")
		require.Error(t, err)
		require.Eventually(t, func() bool { return b.proxy.Stats().Refused >= 1 }, 3*time.Second, 10*time.Millisecond)

		b.proxy.Heal()
		c3, r3 := dial(t, b.proxy.Addr())
		got, err := roundTrip(c3, r3, "after")
		require.NoError(t, err)
		require.Equal(t, "after", got)
		require.Equal(t, int64(1), b.proxy.Stats().Cut)
	})

	t.Run("DelayHoldsEveryChunk", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, r := dial(t, b.proxy.Addr())
		const delay = 150 * time.Millisecond
		b.proxy.Delay(delay)
		start := time.Now()
		got, err := roundTrip(c, r, "slow")
		require.NoError(t, err)
		require.Equal(t, "slow", got)
		// One chunk each way, each held for the delay.
		require.GreaterOrEqual(t, time.Since(start), 2*delay)
		require.Equal(t, int64(2), b.proxy.Stats().Delayed)

		b.proxy.Heal()
		start = time.Now()
		_, err = roundTrip(c, r, "fast")
		require.NoError(t, err)
		require.Less(t, time.Since(start), delay)
	})

	t.Run("HealLetsHeldChunksGo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, r := dial(t, b.proxy.Addr())
		b.proxy.Delay(time.Hour)
		done := make(chan error, 1)
		go func() {
			_, err := roundTrip(c, r, "held")
			done <- err
		}()
		require.Eventually(t, func() bool { return b.proxy.Stats().Delayed >= 1 }, 3*time.Second, 10*time.Millisecond)
		b.proxy.Heal()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(3 * time.Second):
			t.Fatal("a held chunk was not let go by Heal")
		}
	})

	t.Run("CloseIsIdempotent", func(t *testing.T) {
		t.Parallel()
		p, err := proxy.Listen("127.0.0.1:0", echoServer(t))
		require.NoError(t, err)
		c, r := dial(t, p.Addr())
		_, err = roundTrip(c, r, "x")
		require.NoError(t, err)
		require.NoError(t, p.Close())
		require.NoError(t, p.Close())
	})
}

package pgdb_test

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/outboxshop/outboxshop/internal/pgdb"
)

// TestDeadPeerTimeout reads back, from the pool's own TCP connection, what tells a silent
// server from a slow one: TCP_USER_TIMEOUT and the keepalive probes. What they do across a
// real partition is the chaos scenario pg-primary-isolated's to show (a relay cut off
// mid-statement gives up within the bound and follows the failover).
func TestDeadPeerTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		set  time.Duration
		want time.Duration
	}{
		{"default", 0, pgdb.DefaultDeadPeerTimeout},
		{"set", 4 * time.Second, 4 * time.Second},
		{"none", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := pgdb.Open(t.Context(), pgdb.Config{URL: freshDatabaseURL(t, ""), DeadPeerTimeout: tc.set})
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			conn, err := pool.Acquire(t.Context())
			require.NoError(t, err)
			defer conn.Release()
			tcp, ok := conn.Conn().PgConn().Conn().(*net.TCPConn)
			require.True(t, ok, "a TCP connection, not %T", conn.Conn().PgConn().Conn())
			raw, err := tcp.SyscallConn()
			require.NoError(t, err)
			var user, keepalive, idle, interval, count int
			var errs [5]error
			require.NoError(t, raw.Control(func(fd uintptr) {
				user, errs[0] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
				keepalive, errs[1] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
				idle, errs[2] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
				interval, errs[3] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
				count, errs[4] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
			}))
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, int(tc.want.Milliseconds()), user, "TCP_USER_TIMEOUT in ms")
			require.Equal(t, 1, keepalive, "SO_KEEPALIVE")
			if tc.want == 0 {
				return // pgx's own dialer: keepalives after minutes, the kernel's count
			}
			// The kernel counts keepalive times in whole seconds; Go rounds up.
			secs := func(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }
			require.Equal(t, secs(tc.want/2), idle, "TCP_KEEPIDLE in s")
			require.Equal(t, secs(tc.want/4), interval, "TCP_KEEPINTVL in s")
			require.Equal(t, 2, count, "TCP_KEEPCNT")
		})
	}
}

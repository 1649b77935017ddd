package bench_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

func TestProcParsing(t *testing.T) {
	t.Parallel()

	t.Run("StatUserPlusSystem", func(t *testing.T) {
		t.Parallel()
		// A beam.smp line as Linux 6 writes it: utime 1523, stime 377.
		line := "2978 (beam.smp) S 2960 2960 2960 0 -1 4194560 52349 0 3 0 1523 377 0 0 20 0 36 0 4517 2417295360 32345 18446744073709551615 1 1 0 0 0 0 0 4224 17479 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
		n, err := bench.ParseProcStat([]byte(line))
		require.NoError(t, err)
		require.Equal(t, uint64(1900), n)
	})

	t.Run("StatNameWithSpacesAndParentheses", func(t *testing.T) {
		t.Parallel()
		line := "77 (a) b (c)) R 1 77 77 0 -1 0 0 0 0 0 5 7 0 0 20 0 1 0 100 0 0"
		n, err := bench.ParseProcStat([]byte(line))
		require.NoError(t, err)
		require.Equal(t, uint64(12), n)
	})

	t.Run("StatMalformed", func(t *testing.T) {
		t.Parallel()
		for _, line := range []string{"", "12 no name", "12 (x) S 1 2 3", "12 (x) S 1 2 3 4 5 6 7 8 9 10 u 12 13"} {
			_, err := bench.ParseProcStat([]byte(line))
			require.Error(t, err, "%q", line)
		}
	})

	t.Run("MachineTotalAndIdle", func(t *testing.T) {
		t.Parallel()
		stat := "cpu  100 5 50 800 20 3 2 1 40 0\ncpu0 50 2 25 400 10 1 1 0 20 0\nintr 12345\n"
		total, idle, err := bench.ParseProcStatCPU([]byte(stat))
		require.NoError(t, err)
		require.Equal(t, uint64(100+5+50+800+20+3+2+1), total, "guest time is already in user")
		require.Equal(t, uint64(820), idle, "idle + iowait")

		_, _, err = bench.ParseProcStatCPU([]byte("cpu0 1 2 3 4 5\n"))
		require.Error(t, err, "no aggregate cpu line")
		_, _, err = bench.ParseProcStatCPU([]byte("cpu 1 2 x 4 5\n"))
		require.Error(t, err)
	})

	t.Run("ListeningSocketsOnPort", func(t *testing.T) {
		t.Parallel()
		tcp := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
			"   0: 00000000:1628 00000000:0000 0A 00000000:00000000 00:00000000 00000000   104        0 31337 1 0000000000000000 100 0 0 10 0\n" +
			"   1: 0100007F:1628 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000   104        0 42424 1 0000000000000000 20 4 30 10 -1\n" +
			"   2: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   105        0 55555 1 0000000000000000 100 0 0 10 0\n"
		require.Equal(t, []string{"31337"}, bench.ListeningInodes([]byte(tcp), 5672), "listening (0A) on 0x1628 only, not the established one")
		require.Equal(t, []string{"55555"}, bench.ListeningInodes([]byte(tcp), 5432))
		require.Empty(t, bench.ListeningInodes([]byte(tcp), 15672))
	})
}

func TestCPUArithmetic(t *testing.T) {
	t.Parallel()

	t.Run("BackendTicks", func(t *testing.T) {
		t.Parallel()
		before := map[int]uint64{10: 100, 11: 50, 12: 70}
		after := map[int]uint64{10: 160, 11: 50, 13: 25, 12: 5}
		// 10: +60; 11: 0; 13 started in between: 25 whole; 12 reads less (a reused pid): 5 whole.
		require.Equal(t, uint64(90), bench.BackendTicks(before, after))
		require.Zero(t, bench.BackendTicks(before, nil), "backends that ended in between are lost, not negative")
	})

	t.Run("IdleShare", func(t *testing.T) {
		t.Parallel()
		require.InDelta(t, 0.37, bench.IdleShare(1000, 400, 2000, 770), 1e-9)
		require.True(t, math.IsNaN(bench.IdleShare(1000, 400, 1000, 400)), "no time passed")
		require.True(t, math.IsNaN(bench.IdleShare(1000, 400, 2000, 300)), "a counter went back")
	})

	t.Run("PerThousandAndCores", func(t *testing.T) {
		t.Parallel()
		u := bench.CPUUsage{Messages: 200_000, Elapsed: 40 * time.Second, Process: 10 * time.Second, Postgres: -1, Broker: 30 * time.Second, Idle: 0.25}
		require.Equal(t, 50*time.Millisecond, u.PerThousand(u.Process))
		require.Equal(t, 150*time.Millisecond, u.PerThousand(u.Broker))
		require.Negative(t, u.PerThousand(u.Postgres), "unknown stays unknown")
		require.InDelta(t, 0.75, u.Cores(u.Broker), 1e-9)
		require.True(t, math.IsNaN(u.Cores(u.Postgres)))
		require.Negative(t, bench.CPUUsage{Process: time.Second}.PerThousand(time.Second), "no messages")
	})

	t.Run("CPUShare", func(t *testing.T) {
		t.Parallel()
		// Limit A: publisher and broker, no database: 30 + 120 ms per 1,000 messages.
		a := &bench.CPUUsage{Messages: 100_000, Elapsed: 10 * time.Second, Process: 3 * time.Second, Postgres: -1, Broker: 12 * time.Second}
		// A drain: relay 50, pg 50, broker 150 ms per 1,000 rows.
		d := &bench.CPUUsage{Messages: 200_000, Elapsed: 40 * time.Second, Process: 10 * time.Second, Postgres: 10 * time.Second, Broker: 30 * time.Second}
		require.InDelta(t, 0.60, bench.CPUShare(a, d), 1e-9)
		noPG := *d
		noPG.Postgres = -1
		require.True(t, math.IsNaN(bench.CPUShare(a, &noPG)), "a drain without its database's share would look cheaper than it is")
		noBroker := *a
		noBroker.Broker = -1
		require.True(t, math.IsNaN(bench.CPUShare(&noBroker, d)))
		require.True(t, math.IsNaN(bench.CPUShare(nil, d)))
		require.True(t, math.IsNaN(bench.CPUShare(a, &bench.CPUUsage{Broker: time.Second})), "no messages")
	})

	t.Run("Format", func(t *testing.T) {
		t.Parallel()
		u := &bench.CPUUsage{Messages: 200_000, Elapsed: 40 * time.Second, Process: 10 * time.Second, Postgres: 10020 * time.Millisecond, Broker: 27800 * time.Millisecond, Idle: 0.37}
		require.Equal(t, "relay 50.0 ms · pg 50.1 ms · broker 139 ms · idle 37%", bench.FormatCPU(u, "relay"))
		u.Postgres, u.Idle = -1, math.NaN()
		require.Equal(t, "publisher 50.0 ms · broker 139 ms", bench.FormatCPU(u, "publisher"))
		require.Equal(t, "—", bench.FormatCPU(nil, "relay"))
		require.Equal(t, "—", bench.FormatCPU(&bench.CPUUsage{Process: -1, Postgres: -1, Broker: -1, Idle: math.NaN(), Messages: 1}, "relay"))
	})
}

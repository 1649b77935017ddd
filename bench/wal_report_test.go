package bench_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

// walResults is results() with item 10: the WAL relay at 90% of A's 10,000 msg/s (one
// channel), one aggregate's at 80%, the polling relay beside it.
func walResults() bench.Results {
	r := results()
	cpu := &bench.CPUUsage{Messages: 200_000, Elapsed: 22 * time.Second, Process: 6 * time.Second, Postgres: 4 * time.Second, Broker: 26 * time.Second, Idle: 0.1}
	r.WAL = &bench.WALResult{
		Server: "PostgreSQL 15.20, wal_level=logical", Batch: 500, InFlight: 2,
		Drains: []bench.WALDrain{
			{Relay: bench.RelayPoll, Rows: 200_000, Published: 200_000, Rate: 7_500},
			{Relay: bench.RelayWAL, Rows: 200_000, Published: 200_000, Rate: 9_000, CPU: cpu},
			{Relay: bench.RelayWALDelete, Rows: 200_000, Published: 200_000, Rate: 9_500},
			{Relay: bench.RelayPoll, Hot: true, Rows: 200_000, Published: 3_000, Bounded: true, Rate: 150},
			{Relay: bench.RelayWAL, Hot: true, Rows: 200_000, Published: 200_000, Rate: 8_000},
			{Relay: bench.RelayWALDelete, Hot: true, Rows: 200_000, Published: 200_000, Rate: 7_000},
		},
		Latency: []bench.LatencyResult{
			{Rate: 300, Notify: true, Relay: bench.RelayPoll, Achieved: 299, Duration: 20 * time.Second,
				Confirm:  bench.Latencies{N: 6_000, P50: 4 * time.Millisecond, P99: 12 * time.Millisecond},
				Reserved: bench.Latencies{N: 6_000, P50: 9 * time.Millisecond, P99: 25 * time.Millisecond}},
			{Rate: 300, Notify: true, Relay: bench.RelayWAL, Achieved: 299, Duration: 20 * time.Second,
				Confirm:  bench.Latencies{N: 6_000, P50: 2 * time.Millisecond, P99: 7 * time.Millisecond},
				Reserved: bench.Latencies{N: 6_000, P50: 6 * time.Millisecond, P99: 22 * time.Millisecond}},
			{Rate: 7_200, Notify: true, Relay: bench.RelayWAL, Sustained: true, Achieved: 4_500, Duration: time.Minute,
				Confirm:  bench.Latencies{N: 270_000, P50: 10 * time.Millisecond, P99: 40 * time.Millisecond, P999: 90 * time.Millisecond},
				Reserved: bench.Latencies{N: 1_000}, Missing: 269_000},
		},
		Writers: []bench.WALWriters{
			{Relay: bench.RelayNone, Writers: 16, Rate: 4_000},
			{Relay: bench.RelayPoll, Writers: 16, Rate: 3_000},
			{Relay: bench.RelayWAL, Writers: 16, Err: errors.New("too many clients")},
		},
		Kill: &bench.WALKill{Rows: 200_000, KilledAt: 100_012, Received: 201_000, Duplicates: 1_000,
			FirstPublish: 300 * time.Millisecond, Drained: 20 * time.Second},
	}
	return r
}

func TestWALRows(t *testing.T) {
	t.Parallel()

	t.Run("RatiosAndTargets", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(walResults())
		require.Equal(t, "PostgreSQL 15.20, wal_level=logical", row(t, tab, "the private server of item 10").Result)
		poll := row(t, tab, "polling relay drain of 200,000 rows, batch 500")
		require.Equal(t, "75% of A (1 ch)", poll.Ratio)
		require.Empty(t, poll.Target, "the polling relay is there for the ratio")
		wal := row(t, tab, "WAL relay drain of 200,000 rows, batch 500, pipelined (2 batches in flight)")
		require.Equal(t, "10", wal.Item)
		require.Equal(t, "9,000 rows/s", wal.Result)
		require.Equal(t, "90% of A (1 ch) · 1.20× polling · A's CPU per msg 67% of this row's", wal.Ratio,
			"A: 120 ms per 1,000 (publisher + broker); the WAL relay 180 (relay + pg + broker)")
		require.Equal(t, "✓ ≥ 85% of A", wal.Target)
		require.Equal(t, "relay 30.0 ms · pg 20.0 ms · broker 130 ms · idle 10%", wal.CPU)
		require.Equal(t, "9.00×", row(t, tab, "the WAL relay's drain against Watermill's forwarder").Ratio)
		require.Equal(t, "✗ ≥ 10× peer", row(t, tab, "the WAL relay's drain against Watermill's forwarder").Target)

		del := row(t, tab, "WAL relay (DeletePublished) drain of 200,000 rows, batch 500")
		require.Equal(t, "95% of A (1 ch) · 1.27× polling", del.Ratio)
		require.Equal(t, "✓ ≥ 85% of A", del.Target)
		require.Equal(t, "9.50×", row(t, tab, "the WAL relay (DeletePublished)'s drain against Watermill's forwarder").Ratio)
		require.Equal(t, "70% of A (1 ch) · 46.7× polling", row(t, tab, "WAL relay (DeletePublished) drain of 200,000 rows, all of one aggregate").Ratio)
		require.Equal(t, "✗ ≥ 75% of A", row(t, tab, "WAL relay (DeletePublished) drain of 200,000 rows, all of one aggregate").Target)

		hotPoll := row(t, tab, "polling relay drain of 200,000 rows, all of one aggregate")
		require.Equal(t, "150 rows/s (3,000 published in the time bound)", hotPoll.Result)
		hot := row(t, tab, "WAL relay drain of 200,000 rows, all of one aggregate")
		require.Equal(t, "80% of A (1 ch) · 53.3× polling", hot.Ratio)
		require.Equal(t, "✓ ≥ 75% of A", hot.Target)

		require.Empty(t, row(t, tab, "commit → broker confirm @ 300 orders/s, polling relay").Target)
		require.Equal(t, "✓ p99 ≤ 8.00 ms", row(t, tab, "commit → broker confirm @ 300 orders/s, WAL relay").Target)
		require.Equal(t, "✗ p99 ≤ 20.0 ms", row(t, tab, "commit → warehouse inbox commit @ 300 orders/s, WAL relay").Target)
		sustained := row(t, tab, "commit → broker confirm sustained @ 7,200 orders/s (80% of the lower of the WAL relay's drain and the writers' rate beside it) for 1m0s, WAL relay (achieved 4,500/s)")
		require.Equal(t, "p50 10.0 ms · p99 40.0 ms · p99.9 90.0 ms", sustained.Result)
		require.Equal(t, "achieved 50% of the WAL relay's drain", sustained.Ratio)
		require.Equal(t, "✓ p99 ≤ 50.0 ms", sustained.Target)
		require.Empty(t, rows(tab, "commit → warehouse inbox commit sustained"), "the consumer is not what the sustained run measures")

		require.Empty(t, row(t, tab, "16 writers, no relay").Ratio)
		require.Equal(t, "75% of no relay", row(t, tab, "16 writers, the polling relay publishing").Ratio)
		require.Equal(t, "error: too many clients", row(t, tab, "16 writers, the WAL relay publishing").Result)

		kill := row(t, tab, "WAL relay process SIGKILLed mid-drain of 200,000 rows")
		require.Equal(t, "1,000 duplicates · first publish 300 ms after the restart · all published 20.0 s after the kill", kill.Result)
		require.Equal(t, "killed at 100,012 of 200,000 in the queue · 0 lost", kill.Ratio)
	})

	t.Run("SustainableRate", func(t *testing.T) {
		t.Parallel()
		w := walResults().WAL
		require.InDelta(t, 9_000, w.SustainableRate(), 0, "the writers beside the WAL relay failed: its drain")
		w.Writers[2] = bench.WALWriters{Relay: bench.RelayWAL, Writers: 16, Rate: 3_500}
		require.InDelta(t, 3_500, w.SustainableRate(), 0, "the writers are the lower ceiling")
		w.Drains[1].Err = errors.New("slot in use")
		require.InDelta(t, 3_500, w.SustainableRate(), 0)
		w.Writers = nil
		require.Zero(t, w.SustainableRate(), "nothing measured")
	})

	t.Run("NoServer", func(t *testing.T) {
		t.Parallel()
		r := results()
		r.WAL = &bench.WALResult{Err: errors.New("pg_basebackup not found")}
		tab := bench.BuildTable(r)
		require.Len(t, rows(tab, "WAL relay"), 1)
		require.Equal(t, "error: pg_basebackup not found", row(t, tab, "WAL relay beside the polling relay").Result)
	})

	t.Run("NoLimitA", func(t *testing.T) {
		t.Parallel()
		r := walResults()
		r.LimitA = nil
		wal := row(t, bench.BuildTable(r), "WAL relay drain of 200,000 rows, batch 500, pipelined")
		require.Equal(t, "— of A (1 ch) · 1.20× polling", wal.Ratio)
		require.Equal(t, "? ≥ 85% of A (not measured)", wal.Target)
	})
}

package bench_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

func TestMarkdown(t *testing.T) {
	t.Parallel()

	t.Run("PaddedColumnsWithHeader", func(t *testing.T) {
		t.Parallel()
		var tab bench.Table
		tab.Add(bench.Row{Item: "A", What: "RabbitMQ", Result: "12,345 msg/s"})
		tab.Add(bench.Row{Item: "3", What: "relay drain", Result: "8,000 rows/s", Ratio: "65% of A (1 ch)", Target: "✓ ≥ 60% of A", CPU: "relay 50.0 ms"})
		want := "" +
			"| # | measurement | result       | ratio (same run) | target       | CPU per 1,000 msgs |\n" +
			"| - | ----------- | ------------ | ---------------- | ------------ | ------------------ |\n" +
			"| A | RabbitMQ    | 12,345 msg/s |                  |              |                    |\n" +
			"| 3 | relay drain | 8,000 rows/s | 65% of A (1 ch)  | ✓ ≥ 60% of A | relay 50.0 ms      |\n"
		require.Equal(t, want, tab.Markdown())
	})

	t.Run("PipesAreEscaped", func(t *testing.T) {
		t.Parallel()
		tab := bench.Table{Rows: []bench.Row{{Item: "5", What: "a|b", Result: "x"}}}
		out := tab.Markdown()
		require.Contains(t, out, `a\|b`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			require.Equal(t, 7, strings.Count(line, "|")-strings.Count(line, `\|`), "six columns in %q", line)
		}
	})

	t.Run("EmptyTableIsTheHeader", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, 2, strings.Count(bench.Table{}.Markdown(), "\n"))
	})
}

func TestFormat(t *testing.T) {
	t.Parallel()

	t.Run("Rate", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "12,345 msg/s", bench.FormatRate(12_345.4, "msg/s"))
		require.Equal(t, "1,234,568 rows/s", bench.FormatRate(1_234_567.8, "rows/s"))
		require.Equal(t, "100 tx/s", bench.FormatRate(99.96, "tx/s"))
		require.Equal(t, "85.3 tx/s", bench.FormatRate(85.34, "tx/s"))
		require.Equal(t, "—", bench.FormatRate(0, "tx/s"))
		require.Equal(t, "—", bench.FormatRate(math.NaN(), "tx/s"))
		require.Equal(t, "—", bench.FormatRate(math.Inf(1), "tx/s"))
		require.Equal(t, "200,000", bench.FormatCount(200_000))
		require.Equal(t, "999", bench.FormatCount(999))
	})

	t.Run("Latency", func(t *testing.T) {
		t.Parallel()
		for d, want := range map[time.Duration]string{
			850 * time.Microsecond:   "850 µs",
			12500 * time.Nanosecond:  "12.5 µs",
			2140 * time.Microsecond:  "2.14 ms",
			21400 * time.Microsecond: "21.4 ms",
			214 * time.Millisecond:   "214 ms",
			1234 * time.Millisecond:  "1.23 s",
			0:                        "0",
		} {
			require.Equal(t, want, bench.FormatLatency(d), "%s", d)
		}
		require.Equal(t, "p50 2.00 ms · p99 9.00 ms · p99.9 12.0 ms",
			bench.FormatLatencies(bench.Latencies{N: 3, P50: 2 * time.Millisecond, P99: 9 * time.Millisecond, P999: 12 * time.Millisecond}))
		require.Equal(t, "no samples", bench.FormatLatencies(bench.Latencies{}))
	})

	t.Run("Ratios", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "65%", bench.FormatPercent(0.654))
		require.Equal(t, "116%", bench.FormatPercent(1.16))
		require.Equal(t, "—", bench.FormatPercent(math.NaN()))
		require.Equal(t, "11.4×", bench.FormatTimes(11.43))
		require.Equal(t, "143×", bench.FormatTimes(142.6))
		require.Equal(t, "1.03×", bench.FormatTimes(1.031))
		require.Equal(t, "—", bench.FormatTimes(math.NaN()))
		require.Equal(t, "23.5 MiB", bench.FormatMiB(23*1<<20+1<<19))
		require.InDelta(t, 0.5, bench.Ratio(1, 2), 1e-12)
		require.True(t, math.IsNaN(bench.Ratio(1, 0)), "a missing limit is no ratio")
		require.True(t, math.IsNaN(bench.Ratio(0, 2)), "a failed measurement is no ratio")
		require.True(t, math.IsNaN(bench.Ratio(math.NaN(), 2)))
	})
}

func TestFormatRoundsBeforeChoosingDigits(t *testing.T) {
	t.Parallel()
	require.Equal(t, "10.0 ms", bench.FormatLatency(9996*time.Microsecond))
	require.Equal(t, "100 ms", bench.FormatLatency(99_960*time.Microsecond))
	require.Equal(t, "1.00 s", bench.FormatLatency(999_600*time.Microsecond))
	require.Equal(t, "10.0×", bench.FormatTimes(9.996))
}

// consumeResults is a run of item 9 with round figures, beside limit B with 8 and 16
// writers: limit C, then the inbox consumer at concurrency 8 and 32 (B has no 32).
func consumeResults() bench.Results {
	r := results()
	r.LimitB = []bench.Measured{{N: 8, Rate: 4_000}, {N: 16, Rate: 5_000}, {N: 32, Err: errors.New("too many clients")}}
	cpu := func(consumer, pg, broker time.Duration) *bench.CPUUsage {
		return &bench.CPUUsage{Messages: 200_000, Elapsed: 20 * time.Second, Process: consumer, Postgres: pg, Broker: broker, Idle: 0.1}
	}
	r.Consume = []bench.ConsumeResult{
		{Kind: bench.ConsumeAckEach, Prefetch: 32, Messages: 200_000, Rate: 10_000, CPU: cpu(4*time.Second, -1, 20*time.Second)},
		{Kind: bench.ConsumeAckMultiple, Prefetch: 32, Messages: 200_000, Rate: 15_000, CPU: cpu(3*time.Second, -1, 10*time.Second)},
		{Kind: bench.ConsumeInboxNoop, Concurrency: 8, Prefetch: 32, Messages: 200_000, Rate: 2_000,
			CPU: cpu(40*time.Second, 60*time.Second, 30*time.Second)},
		{Kind: bench.ConsumeInboxNoop, Concurrency: 32, Prefetch: 32, Messages: 200_000, Rate: 2_500},
		{Kind: bench.ConsumeInboxSpread, Concurrency: 8, Prefetch: 32, Messages: 200_000, Rate: 1_000, Failed: 3},
		{Kind: bench.ConsumeInboxHot, Concurrency: 8, Prefetch: 32, Messages: 200_000, Err: errors.New("processed 10 of 200000 messages\nnone for 30s")},
	}
	return r
}

func TestConsumeRows(t *testing.T) {
	t.Parallel()

	t.Run("LimitCAndTheTarget", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(consumeResults())
		require.Len(t, rows(tab, "RabbitMQ consume"), 2)
		each := row(t, tab, "RabbitMQ consume: 200,000 persistent 1 KiB from a quorum queue (the shop's), prefetch 32, ack per message")
		require.Equal(t, "C", each.Item)
		require.Equal(t, "10,000 msg/s", each.Result)
		require.Empty(t, each.Ratio)
		require.Empty(t, each.Target, "the target is the multiple acks' row")
		require.Equal(t, "consumer 20.0 ms · broker 100 ms · idle 10%", each.CPU)
		multiple := row(t, tab, "prefetch 32, ack with multiple every 16th")
		require.Equal(t, "15,000 msg/s", multiple.Result)
		require.Equal(t, "1.50× ack per message · broker CPU per msg 50% of ack per message's", multiple.Ratio)
		require.Equal(t, "✓ broker CPU per 1,000 ≤ 65% of ack per message's", multiple.Target)

		r := consumeResults()
		r.Consume[1].CPU.Broker = 14 * time.Second // 70 ms per 1,000 against 100
		require.Equal(t, "✗ broker CPU per 1,000 ≤ 65% of ack per message's", row(t, bench.BuildTable(r), "every 16th").Target)
	})

	t.Run("InboxAgainstCAndB", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(consumeResults())
		require.Len(t, rows(tab, "inbox consumer drain"), 4)
		noop := row(t, tab, "inbox consumer drain of 200,000 (quorum queue, prefetch 32, concurrency 8): a handler that does nothing")
		require.Equal(t, "9", noop.Item)
		require.Equal(t, "2,000 msg/s", noop.Result)
		require.Equal(t, "20% of C (ack per message) · 50% of B (8 writers)", noop.Ratio)
		require.Equal(t, "consumer 200 ms · pg 300 ms · broker 150 ms · idle 10%", noop.CPU)
		require.Empty(t, noop.Target)
		wide := row(t, tab, "concurrency 32): a handler that does nothing")
		require.Equal(t, "25% of C (ack per message) · 50% of B's best (16 writers)", wide.Ratio,
			"B failed with 32 writers: the run's best B instead")
		require.Equal(t, "—", wide.CPU, "not measured")
		spread := row(t, tab, "the warehouse's handler, orders spread over 10,000 SKUs")
		require.Equal(t, "1,000 msg/s (3 attempts failed and retried)", spread.Result)
		require.Equal(t, "10% of C (ack per message) · 25% of B (8 writers)", spread.Ratio)
	})

	t.Run("AnErrorStaysInItsRow", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(consumeResults())
		hot := row(t, tab, "the warehouse's handler, every order on one of the 5 hot SKUs")
		require.Equal(t, "error: processed 10 of 200000 messages none for 30s", hot.Result, "on one line")
		require.Equal(t, "— of C (ack per message) · — of B (8 writers)", hot.Ratio)
		require.Empty(t, hot.CPU)
		require.Equal(t, "2,000 msg/s", row(t, tab, "concurrency 8): a handler that does nothing").Result, "the other rows are there")
	})

	t.Run("MissingLimits", func(t *testing.T) {
		t.Parallel()
		r := consumeResults()
		r.LimitB = nil
		r.Consume[0].Err = errors.New("channel closed")
		tab := bench.BuildTable(r)
		require.Equal(t, "error: channel closed", row(t, tab, "ack per message").Result)
		multiple := row(t, tab, "every 16th")
		require.Equal(t, "— ack per message", multiple.Ratio)
		require.Equal(t, "? broker CPU per 1,000 ≤ 65% of ack per message's (not measured)", multiple.Target)
		require.Equal(t, "— of C (ack per message) · — of B (8 writers)", row(t, tab, "concurrency 8): a handler").Ratio)

		r = consumeResults()
		r.Consume[0].CPU.Broker = -1 // a broker on another machine
		require.Equal(t, "1.50× ack per message", row(t, bench.BuildTable(r), "every 16th").Ratio)
		require.Equal(t, "? broker CPU per 1,000 ≤ 65% of ack per message's (not measured)", row(t, bench.BuildTable(r), "every 16th").Target)
	})

	t.Run("OnlyWhenThePhaseRan", func(t *testing.T) {
		t.Parallel()
		require.Empty(t, rows(bench.BuildTable(results()), "consume"))
		r := bench.Results{Sizes: bench.QuickSizes(), Consume: consumeResults().Consume[:1]}
		require.Len(t, bench.BuildTable(r).Rows, 1)
	})
}

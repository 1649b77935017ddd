package bench_test

import (
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

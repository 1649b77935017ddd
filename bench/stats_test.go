package bench_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentile(t *testing.T) {
	t.Parallel()
	sorted := make([]time.Duration, 1000)
	for i := range sorted {
		sorted[i] = ms(i + 1) // 1 ms … 1000 ms
	}
	for _, tc := range []struct {
		name string
		q    float64
		want time.Duration
	}{
		{"median", 0.5, ms(500)},
		{"p99", 0.99, ms(990)},
		{"p99.9", 0.999, ms(999)},
		{"max", 1, ms(1000)},
		{"below the first rank is the minimum", 0.0001, ms(1)},
		{"zero clamps to the minimum", 0, ms(1)},
		{"above one clamps to the maximum", 2, ms(1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, bench.Percentile(sorted, tc.q))
		})
	}

	t.Run("EmptyIsZero", func(t *testing.T) {
		t.Parallel()
		require.Zero(t, bench.Percentile(nil, 0.5))
	})

	t.Run("NearestRankOnSmallSamples", func(t *testing.T) {
		t.Parallel()
		s := []time.Duration{ms(10), ms(20), ms(30)}
		require.Equal(t, ms(20), bench.Percentile(s, 0.5))
		require.Equal(t, ms(30), bench.Percentile(s, 0.99), "p99 of three samples is the largest")
		require.Equal(t, ms(10), bench.Percentile(s, 0.33))
	})
}

func TestSummarize(t *testing.T) {
	t.Parallel()

	t.Run("UnsortedInputIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		in := []time.Duration{ms(5), ms(1), ms(4), ms(2), ms(3)}
		got := bench.Summarize(in)
		require.Equal(t, bench.Latencies{N: 5, P50: ms(3), P99: ms(5), P999: ms(5), Max: ms(5)}, got)
		require.Equal(t, []time.Duration{ms(5), ms(1), ms(4), ms(2), ms(3)}, in)
	})

	t.Run("OutlierShowsOnlyInTheTail", func(t *testing.T) {
		t.Parallel()
		in := make([]time.Duration, 10_000)
		for i := range in {
			in[i] = ms(2)
		}
		in[42] = time.Second
		got := bench.Summarize(in)
		require.Equal(t, ms(2), got.P50)
		require.Equal(t, ms(2), got.P99)
		require.Equal(t, ms(2), got.P999, "one sample in 10,000 is beyond p99.9")
		require.Equal(t, time.Second, got.Max)
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, bench.Latencies{}, bench.Summarize(nil))
	})

	t.Run("Median", func(t *testing.T) {
		t.Parallel()
		in := []time.Duration{ms(9), ms(1), ms(5)}
		require.Equal(t, ms(5), bench.Median(in))
		require.Equal(t, []time.Duration{ms(9), ms(1), ms(5)}, in)
	})
}

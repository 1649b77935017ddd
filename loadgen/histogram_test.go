package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHistogram(t *testing.T) {
	t.Parallel()

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		var h histogram
		require.Equal(t, Percentiles{}, h.percentiles())
	})

	t.Run("ExactBelow128ns", func(t *testing.T) {
		t.Parallel()
		var h histogram
		for v := range 100 {
			h.record(time.Duration(v + 1))
		}
		require.Equal(t, Percentiles{P50: 50, P95: 95, P99: 99, Max: 100}, h.percentiles())
	})

	t.Run("BucketsCoverEveryValueOnce", func(t *testing.T) {
		t.Parallel()
		// Every bucket's upper bound + 1 is the next bucket's first value.
		for i := range histBuckets - 1 {
			require.Equal(t, i, histIndex(histUpper(i)), "upper bound of %d", i)
			require.Equal(t, i+1, histIndex(histUpper(i)+1), "after bucket %d", i)
		}
		require.Equal(t, histBuckets-1, histIndex(math.MaxUint64), "huge values share the last bucket")
	})

	t.Run("WithinOnePointSixPercentOfTheSortedSamples", func(t *testing.T) {
		t.Parallel()
		rng := rand.New(rand.NewPCG(1, 2))
		var h histogram
		samples := make([]time.Duration, 100_000)
		for i := range samples {
			// Log-normal-ish latencies from about 100µs to 10s.
			samples[i] = time.Duration(math.Exp(rng.NormFloat64()*1.5+15) + 100e3)
			h.record(samples[i])
		}
		slices.Sort(samples)
		for _, q := range []float64{0.5, 0.9, 0.95, 0.99, 0.999, 1} {
			exact := samples[int(math.Ceil(q*float64(len(samples))))-1] // nearest rank
			got := h.quantile(q)
			require.GreaterOrEqual(t, got, exact, "q %v never below", q)
			require.LessOrEqual(t, float64(got), float64(exact)*(1+1.0/64), "q %v within 1/64", q)
		}
		require.Equal(t, samples[len(samples)-1], h.percentiles().Max)
	})
}

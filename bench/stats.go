package bench

import (
	"math"
	"slices"
	"time"
)

// Latencies summarises a sample of latencies.
type Latencies struct {
	N                   int
	P50, P99, P999, Max time.Duration
}

// Summarize returns the percentiles of samples, by the nearest-rank method. It sorts a copy;
// samples is left as it was. An empty sample gives the zero Latencies.
func Summarize(samples []time.Duration) Latencies {
	if len(samples) == 0 {
		return Latencies{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Latencies{
		N:    len(s),
		P50:  Percentile(s, 0.50),
		P99:  Percentile(s, 0.99),
		P999: Percentile(s, 0.999),
		Max:  s[len(s)-1],
	}
}

// Percentile returns the q-quantile (0 < q ≤ 1) of sorted by the nearest-rank method: the
// smallest sample with at least q·N samples at or below it. It returns 0 for an empty sample
// and clamps q into (0, 1].
func Percentile(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Median returns the median of samples (the nearest-rank 50th percentile), without
// changing samples.
func Median(samples []time.Duration) time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	return Percentile(s, 0.5)
}

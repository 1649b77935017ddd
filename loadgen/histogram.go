package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// histogram counts latencies in fixed log-linear buckets, as HdrHistogram does, so that a
// run of any length takes the same 18 KiB and a percentile costs one walk over the buckets.
//
// Durations are in nanoseconds. Below 128 ns every value has its own bucket; above, each
// power-of-two range [2^k, 2^(k+1)) is split into 64 equal buckets, so a bucket is never
// wider than 1/64 of its lower bound. A percentile answers its bucket's upper bound (capped at
// the largest value seen): at most 1.6% above the true sample, never below it. Values from
// 2^41 ns (about 36 minutes) up share the last bucket.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    time.Duration
}

const (
	histExact   = 128 // values below are counted exactly
	histSub     = 64  // buckets per power of two above
	histTopBits = 41  // values ≥ 2^41 ns are clamped
	histBuckets = histExact + (histTopBits-7)*histSub
)

func histIndex(v uint64) int {
	if v >= 1<<histTopBits {
		v = 1<<histTopBits - 1
	}
	if v < histExact {
		return int(v)
	}
	shift := bits.Len64(v) - 7 // v>>shift is in [64, 128)
	return histExact + (shift-1)*histSub + int(v>>shift) - histSub
}

// histUpper is the largest value counted in bucket i.
func histUpper(i int) uint64 {
	if i < histExact {
		return uint64(i)
	}
	shift := (i-histExact)/histSub + 1
	sub := uint64((i-histExact)%histSub + histSub)
	return (sub+1)<<shift - 1
}

func (h *histogram) record(d time.Duration) {
	d = max(d, 0)
	h.counts[histIndex(uint64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// quantile returns the nearest-rank q-quantile (0 < q ≤ 1) of the recorded values, to the
// precision above; 0 when nothing was recorded.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(histUpper(i)), h.max)
		}
	}
	return h.max
}

func (h *histogram) percentiles() Percentiles {
	return Percentiles{P50: h.quantile(0.50), P95: h.quantile(0.95), P99: h.quantile(0.99), Max: h.max}
}

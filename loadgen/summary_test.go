package loadgen

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSummary(t *testing.T) {
	t.Parallel()

	t.Run("Healthy", func(t *testing.T) {
		t.Parallel()
		res := Result{
			Placed: 500, Acknowledged: make(map[string]string, 488), Cancelled: 47, Duplicates: 25, Replays: 25,
			RejectedByAPI: 12, Elapsed: 10*time.Second + 2*time.Millisecond,
			Latency: Percentiles{P50: 4123456, P95: 9876543, P99: 15234567, Max: 31 * time.Millisecond},
			rate:    50, concurrency: 8, seed: 7, keyPrefix: "loadgen-1a2b3c4d-", cancelConflicts: 3, latencyCount: 513,
		}
		for i := range 488 {
			res.Acknowledged[string(rune('a'+i%26))+string(rune(i))] = "id"
		}
		require.Equal(t, `loadgen: 500 orders placed in 10.002s (49.99/s; target 50/s, concurrency 8)
  acknowledged  488 (201 Created)
  rejected      12 by the API (unknown SKU: 422, expected)
  duplicates    25 sent; 25 answers were replays (Idempotent-Replayed)
  cancelled     47 (and 3 already rejected by the warehouse: 409, expected)
  retries       0
  errors        none
  latency       p50 4.12ms  p95 9.88ms  p99 15.2ms  max 31ms  (513 answers 201 to POST /orders)
  seed          7 (Idempotency-Keys loadgen-1a2b3c4d-1 to loadgen-1a2b3c4d-500)
`, res.Summary())
	})

	t.Run("Troubled", func(t *testing.T) {
		t.Parallel()
		res := Result{
			Placed: 120, Acknowledged: map[string]string{"k-1": "id"}, Retries: 40, Elapsed: 10 * time.Second,
			Errors:   map[string]int{"mismatch": 1, "connection": 2, "http_5xx": 3},
			examples: map[string]string{"mismatch": "duplicate POST /orders (key k-9): [not marked Idempotent-Replayed]", "connection": "POST /orders (key k-2): connection refused"},
			rate:     50, concurrency: 8, seed: 1, keyPrefix: "k-", due: 500, behind: true,
		}
		require.Equal(t, `loadgen: 120 orders placed in 10s (12/s; target 50/s, concurrency 8)
  acknowledged  1 (201 Created)
  rejected      0 by the API (unknown SKU: 422, expected)
  duplicates    0 sent; 0 answers were replays (Idempotent-Replayed)
  cancelled     0
  retries       40
  errors        6: connection 2, http_5xx 3, mismatch 1
                  connection, e.g. POST /orders (key k-2): connection refused
                  mismatch, e.g. duplicate POST /orders (key k-9): [not marked Idempotent-Replayed]
  latency       no POST /orders answered 201
  FELL BEHIND   placed 120 of the 500 orders due at 50/s: all 8 workers were busy (raise the concurrency, or the shop is slow)
  MISMATCH      1 duplicate(s) were not answered with a replay of the first answer: a correctness bug
  seed          1 (Idempotency-Keys k-1 to k-120)
`, res.Summary())
	})

	t.Run("ZeroValue", func(t *testing.T) {
		t.Parallel()
		require.Contains(t, Result{}.Summary(), "loadgen: 0 orders placed in 0s (0/s; unpaced, concurrency 0)")
	})
}

package bench_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
	"github.com/outboxshop/outboxshop/pkg/inbox"
)

func TestConsumeSizes(t *testing.T) {
	t.Parallel()
	full, quick := bench.FullSizes(), bench.QuickSizes()
	require.Equal(t, 200_000, full.ConsumeBacklog)
	require.Equal(t, []int{8, bench.ConsumePrefetch}, full.ConsumeConcurrency, "the warehouse's and the library's default")
	require.Equal(t, 10_000, quick.ConsumeBacklog)
	require.Equal(t, []int{8}, quick.ConsumeConcurrency)
	require.Equal(t, []int{8, 16}, full.ConsumeBatches, "four and two transactions at once")
	require.Equal(t, []int{16}, quick.ConsumeBatches)
	require.Contains(t, full.ConsumeConcurrency, bench.ConsumeReferenceConcurrency, "the batched drains' reference runs")
	require.Contains(t, quick.ConsumeConcurrency, bench.ConsumeReferenceConcurrency, "the batched drains' reference runs")
	require.Equal(t, bench.PhaseConsume, bench.AllPhases[len(bench.AllPhases)-1], "the consume phase runs last")

	s := bench.QuickSizes()
	s.ConsumeConcurrency = []int{bench.ConsumePrefetch + 1}
	err := bench.Run(context.Background(), bench.Config{PostgresURL: "postgres://unused", AMQPURL: "amqp://unused", Sizes: s}, io.Discard)
	require.ErrorContains(t, err, "consumer concurrency 33 out of range 1..32 (the prefetch)", "refused before any server is touched")
}

func TestConsumeBatchesValidated(t *testing.T) {
	t.Parallel()
	// run returns Run's error for sizes s, with limit A's window broken too, so that a valid
	// config is refused as well, before any server is touched.
	run := func(s bench.Sizes) error {
		s.ConfirmWindow = 0
		return bench.Run(context.Background(), bench.Config{PostgresURL: "postgres://unused", AMQPURL: "amqp://unused", Sizes: s}, io.Discard)
	}

	t.Run("OutOfRange", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name  string
			batch int
		}{
			{"OneIsATransactionPerMessage", 1},
			{"Zero", 0},
			{"Negative", -16},
			{"NotADivisorOfThePrefetch", 12},
			{"MoreThanThePrefetch", inbox.MaxBatch},
			{"MoreThanMaxBatch", 2 * inbox.MaxBatch},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				s := bench.QuickSizes()
				s.ConsumeBatches = []int{16, c.batch}
				err := run(s)
				require.ErrorContains(t, err, fmt.Sprintf("consumer batch %d: want 2..%d (inbox.MaxBatch) and a divisor of the prefetch, %d", c.batch, inbox.MaxBatch, bench.ConsumePrefetch))
				require.NotContains(t, err.Error(), "consumer batch 16", "only the bad one")
			})
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		s := bench.QuickSizes()
		s.ConsumeBatches = nil
		err := bench.Run(context.Background(), bench.Config{PostgresURL: "postgres://unused", AMQPURL: "amqp://unused", Sizes: s}, io.Discard)
		require.ErrorContains(t, err, "every size must be positive and every list non-empty", "refused before any server is touched")
	})

	t.Run("TheSizesOfBothRunsAreValid", func(t *testing.T) {
		t.Parallel()
		for _, s := range []bench.Sizes{bench.FullSizes(), bench.QuickSizes(), {ConsumeBatches: []int{2, 4, 32}}} {
			err := run(s)
			require.Error(t, err, "the broken window")
			require.NotContains(t, err.Error(), "consumer batch")
		}
	})
}

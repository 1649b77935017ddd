package bench_test

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

func TestConsumeSizes(t *testing.T) {
	t.Parallel()
	full, quick := bench.FullSizes(), bench.QuickSizes()
	require.Equal(t, 200_000, full.ConsumeBacklog)
	require.Equal(t, []int{8, bench.ConsumePrefetch}, full.ConsumeConcurrency, "the warehouse's and the library's default")
	require.Equal(t, 10_000, quick.ConsumeBacklog)
	require.Equal(t, []int{8}, quick.ConsumeConcurrency)
	require.Equal(t, bench.PhaseConsume, bench.AllPhases[len(bench.AllPhases)-1], "the consume phase runs last")

	s := bench.QuickSizes()
	s.ConsumeConcurrency = []int{bench.ConsumePrefetch + 1}
	err := bench.Run(context.Background(), bench.Config{PostgresURL: "postgres://unused", AMQPURL: "amqp://unused", Sizes: s}, io.Discard)
	require.ErrorContains(t, err, "consumer concurrency 33 out of range 1..32 (the prefetch)", "refused before any server is touched")
}

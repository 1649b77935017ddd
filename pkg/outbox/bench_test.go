package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// BenchmarkAdd measures writing one event in its own transaction (the outbox's cost to a
// business transaction is a part of this).
func BenchmarkAdd(b *testing.B) {
	bb := setup(b)
	ctx := context.Background()
	m := bb.msg("bench", 0)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		m.ID = [16]byte{}
		m.AggregateID = fmt.Sprint(i)
		require.NoError(b, pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, m) }))
	}
}

// BenchmarkRelayDrain measures draining a backlog through RabbitMQ with confirms: the relay's
// throughput, reported as rows/s.
func BenchmarkRelayDrain(b *testing.B) {
	bb := setup(b)
	ctx := context.Background()
	r, err := outbox.NewRelay(bb.pool, bb.pub, outbox.Config{BatchSize: 500, DisableNotify: true})
	require.NoError(b, err)
	const rows = 5000
	var drained int
	for b.Loop() {
		b.StopTimer()
		batch := make([]outbox.Message, rows)
		for i := range batch {
			batch[i] = bb.msg(fmt.Sprint(i), i)
		}
		bb.write(b, batch...)
		b.StartTimer()
		for {
			n, err := r.PublishBatch(ctx)
			require.NoError(b, err)
			drained += n
			if n == 0 {
				break
			}
		}
	}
	b.ReportMetric(float64(drained)/b.Elapsed().Seconds(), "rows/s")
}

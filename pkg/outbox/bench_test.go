package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
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

// BenchmarkRelayDrainInFlight drains a backlog of distinct aggregates through RabbitMQ with a
// running relay of 1, 2 and 3 batches in flight (1 is the serial relay), in turn, one round
// per iteration (-benchtime=3x: three rounds), and reports each one's rows/s over its rounds:
// what pipelining buys on this machine, with the three exposed alike to whatever else runs.
func BenchmarkRelayDrainInFlight(b *testing.B) {
	const rows = 20_000
	bb := setup(b)
	delivered := countDeliveries(b, bb.amqpURL, bb.top.Queue)
	inFlight := []int{1, 2, 3}
	drained := make([]time.Duration, len(inFlight))
	for range b.N {
		for k, n := range inFlight {
			drained[k] += drainWith(b, bb, n, rows)
		}
	}
	testinfra.Eventually(b, time.Minute, func() bool { return delivered.Load() >= int64(b.N*len(inFlight)*rows) }, "every row delivered")
	for k, n := range inFlight {
		b.ReportMetric(float64(b.N*rows)/drained[k].Seconds(), fmt.Sprintf("rows/s(inflight=%d)", n))
	}
	b.ReportMetric(0, "ns/op")
}

// drainWith fills the outbox with rows pending rows, ~1 KiB each, and returns how long a
// relay of inFlight batches in flight took to publish them all.
func drainWith(b *testing.B, bb *bundle, inFlight, rows int) time.Duration {
	b.Helper()
	ctx := context.Background()
	_, err := bb.pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), $1, 'test.event', 'TestEvent', 'test', 'agg-' || g,
       jsonb_build_object('n', g, 'note', repeat('x', 960))
FROM generate_series(1, $2::int) g`, bb.top.Exchange, rows)
	require.NoError(b, err)
	_, err = bb.pool.Exec(ctx, "VACUUM ANALYZE outbox_messages")
	require.NoError(b, err)
	return timeDrain(b, rows, func(h outbox.Hooks) runner {
		r, err := outbox.NewRelay(bb.pool, bb.pub, outbox.Config{DisableNotify: true, InFlightBatches: inFlight, Hooks: h})
		require.NoError(b, err)
		return r
	})
}

// runner is a relay of either kind.
type runner interface {
	Run(ctx context.Context) error
}

// timeDrain runs the relay newRelay makes with the given hooks until it has published rows
// rows, and returns how long that took.
func timeDrain(b *testing.B, rows int, newRelay func(outbox.Hooks) runner) time.Duration {
	b.Helper()
	ctx := context.Background()
	var published atomic.Int64
	done := make(chan struct{})
	r := newRelay(outbox.Hooks{BatchDone: func(res outbox.BatchResult) {
		if published.Add(int64(len(res.Published))) == int64(rows) {
			close(done)
		}
	}})
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- r.Run(runCtx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("drained %d of %d rows in 10m", published.Load(), rows)
	}
	took := time.Since(start)
	stop()
	require.NoError(b, <-stopped)
	return took
}

// countDeliveries acks and counts the deliveries of queue until the benchmark ends.
func countDeliveries(b *testing.B, url, queue string) *atomic.Int64 {
	b.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(b, err)
	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Qos(1000, 0, false))
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(b, err)
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		i := 0
		for d := range deliveries {
			n.Add(1)
			if i++; i%500 == 0 {
				_ = d.Ack(true)
			}
		}
	}()
	b.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return &n
}

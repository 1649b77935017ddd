package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// BenchmarkWALRelayDrain drains the same backlogs with the polling relay and the WAL relay,
// on one private primary at wal_level=logical (with its synchronous standby, so that both
// pay their replication barrier), and publishes as many messages with the bare publisher,
// the broker's limit for it: each relay's rows/s, and its share of that limit, for a
// backlog of distinct aggregates (spread) and one of a single aggregate (hot). Every row is
// ~1 KiB, written 100 to a transaction.
//
//	go test -run '^$' -bench WALRelayDrain -benchtime 1x ./pkg/outbox
func BenchmarkWALRelayDrain(b *testing.B) {
	const spread, hot, batch = 50_000, 20_000, 500
	ctx := context.Background()
	pair := testinfra.StartLogicalPostgresPair(b)
	pair.CreateDatabase(b, "bench")
	url := pair.Primary.URL("bench")
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=10")
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, outbox.Migrate(ctx, pool))
	store, err := outbox.NewStore(outbox.Tables{})
	require.NoError(b, err)
	require.NoError(b, store.CreatePublication(ctx, pool, ""))
	amqpURL := testinfra.AMQPURL(b)
	bb := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(b, amqpURL)}
	bb.pub = newPublisherConns(b, amqpURL, 2)
	countDeliveries(b, amqpURL, bb.top.Queue)

	fill := func(rows int, aggregates string) {
		b.Helper()
		for done := 0; done < rows; done += 100 {
			_, err := pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), $1, 'test.event', 'TestEvent', 'test', `+aggregates+`,
       json_build_object('n', g, 'note', repeat('x', 960))
FROM generate_series($2::int, $2::int + 99) g`, bb.top.Exchange, done)
			require.NoError(b, err)
		}
		_, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_messages")
		require.NoError(b, err)
	}
	// drain runs a relay until rows rows are published, and returns its rows/s.
	drain := func(rows int, newRelay func(outbox.Hooks) runner) float64 {
		return float64(rows) / timeDrain(b, rows, newRelay).Seconds()
	}
	polling := func(h outbox.Hooks) runner {
		r, err := outbox.NewRelay(pool, bb.pub, outbox.Config{DisableNotify: true, BatchSize: batch, InFlightBatches: 2, Hooks: h})
		require.NoError(b, err)
		return r
	}
	wal := func(h outbox.Hooks) runner {
		r, err := outbox.NewWALRelay(pool, bb.pub, outbox.Config{BatchSize: batch, InFlightBatches: 4, Hooks: h}, outbox.WALConfig{URL: url})
		require.NoError(b, err)
		return r
	}
	// bare publishes rows messages like the backlog's, batch at a time, two at once.
	bare := func(rows int) float64 {
		b.Helper()
		msgs := make([]outbox.Message, batch)
		start := time.Now()
		errs := make(chan []error, 2)
		for sent := 0; sent < rows; sent += 2 * batch {
			for range 2 {
				for i := range msgs {
					msgs[i] = bb.msg(fmt.Sprint(i), i)
					msgs[i].Payload = []byte(fmt.Sprintf(`{"n": %d, "note": "%0960d"}`, i, 0))
				}
				go func(m []outbox.Message) { errs <- bb.pub.Publish(ctx, m) }(append([]outbox.Message(nil), msgs...))
			}
			for range 2 {
				for _, err := range <-errs {
					require.NoError(b, err)
				}
			}
		}
		return float64(rows) / time.Since(start).Seconds()
	}

	for b.Loop() {
		limit := bare(spread)
		// The polling relay first: rows written while the slot exists would be streamed
		// again by the WAL relay.
		fill(spread, "'agg-' || g")
		pollSpread := drain(spread, polling)
		fill(hot/10, "'hot'")
		pollHot := drain(hot/10, polling)

		_, stop := startWAL(b, pool, bb, url) // the slot, then no reader while the backlog is written
		stop()
		fill(spread, "'agg-' || g")
		walSpread := drain(spread, wal)
		fill(hot, "'hot'")
		walHot := drain(hot, wal)

		b.ReportMetric(limit, "bare-msgs/s")
		b.ReportMetric(pollSpread, "poll-rows/s")
		b.ReportMetric(walSpread, "wal-rows/s")
		b.ReportMetric(pollHot, "poll-hot-rows/s")
		b.ReportMetric(walHot, "wal-hot-rows/s")
		b.ReportMetric(100*pollSpread/limit, "poll-%bare")
		b.ReportMetric(100*walSpread/limit, "wal-%bare")
		b.ReportMetric(100*walHot/limit, "wal-hot-%bare")
	}
	b.ReportMetric(0, "ns/op")
}

// startWAL runs a WAL relay until it streams, and returns it with the function that stops it.
func startWAL(b testing.TB, pool *pgxpool.Pool, bb *bundle, url string) (*outbox.WALRelay, func()) {
	b.Helper()
	w, err := outbox.NewWALRelay(pool, bb.pub, outbox.Config{}, outbox.WALConfig{URL: url})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	testinfra.Eventually(b, time.Minute, func() bool { return w.State() == outbox.StateRunning }, "the WAL relay streams")
	return w, func() {
		cancel()
		require.NoError(b, <-done)
	}
}

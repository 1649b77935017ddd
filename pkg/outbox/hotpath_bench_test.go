package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// confirmAll is a Publisher that confirms every message at once, so that a relay cycle is
// its database work only.
type confirmAll struct{}

func (confirmAll) Publish(_ context.Context, msgs []outbox.Message) []error {
	return make([]error, len(msgs))
}

// fillPublished inserts n rows as a relay leaves them (published a day ago, ~1 KiB
// payloads) with one INSERT … SELECT generate_series, then VACUUM ANALYZE, as autovacuum
// would have.
func fillPublished(b *testing.B, bb *bundle, n int) {
	b.Helper()
	ctx := context.Background()
	_, err := bb.pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload,
                             created_at, next_attempt_at, published_at)
SELECT gen_random_uuid(), $1, 'test.event', 'TestEvent', 'test', 'published-' || g,
       jsonb_build_object('n', g, 'note', repeat('x', 960)),
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, $2::int) g`, bb.top.Exchange, n)
	require.NoError(b, err)
	_, err = bb.pool.Exec(ctx, "VACUUM ANALYZE outbox_messages")
	require.NoError(b, err)
}

// benchmarkCycle runs one relay cycle of a batch of 100 pending rows per iteration, with
// published rows already in the table, and times only the part that timed selects: the
// relay's Polled hook marks the end of the claim, BatchDone the end of the mark and commit.
// It reports the cost per row as ns/row.
func benchmarkCycle(b *testing.B, published int, timed func(b *testing.B) outbox.Hooks, startTimed bool) {
	bb := setup(b)
	ctx := context.Background()
	fillPublished(b, bb, published)
	const batch = 100
	r, err := outbox.NewRelay(bb.pool, confirmAll{}, outbox.Config{BatchSize: batch, DisableNotify: true, Hooks: timed(b)})
	require.NoError(b, err)
	msgs := make([]outbox.Message, batch)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range msgs {
			msgs[j] = bb.msg(fmt.Sprintf("%d-%d", i, j), j) // one aggregate per row: a full batch qualifies
		}
		bb.write(b, msgs...)
		if startTimed {
			b.StartTimer()
		}
		n, err := r.PublishBatch(ctx)
		require.NoError(b, err)
		require.Equal(b, batch, n)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/row")
}

// BenchmarkClaim measures claiming a batch of 100 (BEGIN and the claim query, which locks
// the rows and reads them) with 1,000 and 100,000 published rows in the table. The partial
// index on pending rows keeps it O(batch): the cost must not grow with the published rows.
func BenchmarkClaim(b *testing.B) {
	for _, published := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("published=%d", published), func(b *testing.B) {
			benchmarkCycle(b, published, func(b *testing.B) outbox.Hooks {
				return outbox.Hooks{Polled: func(outbox.Poll) { b.StopTimer() }}
			}, true)
		})
	}
}

// BenchmarkMark measures marking a claimed batch of 100 published (the UPDATE … WHERE id =
// ANY, then COMMIT) with 1,000 and 100,000 published rows in the table.
func BenchmarkMark(b *testing.B) {
	for _, published := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("published=%d", published), func(b *testing.B) {
			benchmarkCycle(b, published, func(b *testing.B) outbox.Hooks {
				return outbox.Hooks{
					Polled:    func(outbox.Poll) { b.StartTimer() },
					BatchDone: func(outbox.BatchResult) { b.StopTimer() },
				}
			}, false)
		})
	}
}

// discardDB is a DBTX that runs nothing, so that BenchmarkAddCPU measures Add's own work:
// checking, encoding and choosing the statement.
type discardDB struct{}

func (discardDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

func (discardDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("discardDB runs no queries")
}

func (discardDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// BenchmarkAddCPU measures what Add costs in the process, without the database: validation,
// id, header encoding and the statement's arguments, for one message of about 1 KiB.
func BenchmarkAddCPU(b *testing.B) {
	ctx := context.Background()
	payload, _ := json.Marshal(map[string]string{"order_id": "order-1", "note": strings.Repeat("x", 960)})
	m := outbox.Message{
		Exchange: "shop.events", RoutingKey: "order.created", Type: "OrderCreated",
		AggregateType: "order", AggregateID: "order-1", Payload: payload,
		Headers: map[string]string{outbox.HeaderCorrelationID: "req-42"},
	}
	b.ReportAllocs()
	for b.Loop() {
		m.ID = uuid.Nil
		if err := outbox.Add(ctx, discardDB{}, m); err != nil {
			b.Fatal(err)
		}
	}
}

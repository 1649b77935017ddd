package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The ways a relay that tails the WAL can tell the table which rows went out, each per batch
// of markBatch rows (the WAL relay's batch in the bench), in a transaction of its own:
// today's mark (published_at, as the polling relay's), a DELETE of the rows at once (bare, and
// as Config.DeletePublished runs it), and a watermark (one row holding the stream's
// position, the table's rows left as they are).
// Each leaves the rows to a later cleanup but the DELETE.
const (
	markBatch      = 500
	markCostUpdate = `UPDATE outbox_messages SET published_at = clock_timestamp() WHERE id = ANY($1::uuid[]) AND $2::bigint IS NOT NULL`
	markCostDelete = `DELETE FROM outbox_messages WHERE id = ANY($1::uuid[]) AND $2::bigint IS NOT NULL`
	// markCostDeleted is Config.DeletePublished's statement (deleteConfirmed): the DELETE,
	// and the count of the rows it left.
	markCostDeleted = `
WITH d AS (DELETE FROM outbox_messages WHERE id = ANY($1::uuid[]) AND dead_at IS NULL AND $2::bigint IS NOT NULL RETURNING id)
SELECT count(*) FROM outbox_messages o
WHERE o.id = ANY($1::uuid[]) AND o.dead_at IS NULL AND o.id NOT IN (SELECT id FROM d)`
	markCostWater    = `UPDATE bench_watermark SET seq = $2 WHERE $1::uuid[] IS NOT NULL`
	markCostCleanUp  = `DELETE FROM outbox_messages WHERE seq <= $1`
	markCostWaterTbl = `CREATE TABLE IF NOT EXISTS bench_watermark (seq bigint NOT NULL); INSERT INTO bench_watermark VALUES (0)`
)

// BenchmarkMarkCost measures what each way of recording "published" costs PostgreSQL per
// 1,000 rows: the time of its statements and commits, and the WAL they write; then the
// cleanup that the mark and the watermark leave for later (a DELETE of the same rows by
// seq, as Cleanup deletes). Each iteration writes 1,000 pending rows of ~1 KiB, outside the
// measured span.
//
//	go test -run '^$' -bench MarkCost -benchtime 20x ./pkg/outbox
func BenchmarkMarkCost(b *testing.B) {
	for _, c := range []struct {
		name, mark string
		cleanup    bool
	}{
		{"update", markCostUpdate, true},
		{"delete", markCostDelete, false},
		{"delete-published", markCostDeleted, false},
		{"watermark", markCostWater, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			bb := setup(b)
			ctx := context.Background()
			_, err := bb.pool.Exec(ctx, markCostWaterTbl)
			require.NoError(b, err)
			conn, err := bb.pool.Acquire(ctx)
			require.NoError(b, err)
			defer conn.Release()
			var markTime, cleanTime time.Duration
			var markWAL, cleanWAL int64
			walNow := func() int64 {
				var lsn int64
				require.NoError(b, conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'`).Scan(&lsn))
				return lsn
			}
			for b.Loop() {
				var ids [][16]byte
				var last int64
				require.NoError(b, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					r, err := tx.Query(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), $1, 'test.event', 'TestEvent', 'test', 'agg-' || g, jsonb_build_object('n', g, 'note', repeat('x', 960))
FROM generate_series(1, 1000) g RETURNING id, seq`, bb.top.Exchange)
					if err != nil {
						return err
					}
					for r.Next() {
						var id [16]byte
						if err := r.Scan(&id, &last); err != nil {
							return err
						}
						ids = append(ids, id)
					}
					return r.Err()
				}))
				wal, start := walNow(), time.Now()
				for k := 0; k < len(ids); k += markBatch {
					_, err := conn.Exec(ctx, c.mark, ids[k:k+markBatch], last)
					require.NoError(b, err)
				}
				markTime += time.Since(start)
				markWAL += walNow() - wal
				if c.cleanup {
					wal, start := walNow(), time.Now()
					_, err := conn.Exec(ctx, markCostCleanUp, last)
					require.NoError(b, err)
					cleanTime += time.Since(start)
					cleanWAL += walNow() - wal
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(markTime.Microseconds())/n, "mark-µs/1k")
			b.ReportMetric(float64(markWAL)/n/1024, "mark-WAL-KiB/1k")
			b.ReportMetric(float64(cleanTime.Microseconds())/n, "cleanup-µs/1k")
			b.ReportMetric(float64(cleanWAL)/n/1024, "cleanup-WAL-KiB/1k")
			b.ReportMetric(0, "ns/op")
		})
	}
}

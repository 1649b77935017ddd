package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// ScaleResult is the claim and mark cost per row with Published rows already published in
// the table (item 6).
type ScaleResult struct {
	Published int
	// Claim is BEGIN + the claim query of a batch of 100, per row; Mark is the UPDATE that
	// marks them published + COMMIT, per row. Both are medians over the batches.
	Claim, Mark time.Duration
	Err         error
}

// fillPublished inserts published rows numbered $1..$2-1 with ~1 KiB payloads, as a relay
// leaves them.
const fillPublished = `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload,
                             created_at, next_attempt_at, published_at)
SELECT gen_random_uuid(), 'bench.published', 'order.created', 'OrderCreated', 'order', 'published-' || g,
       jsonb_build_object('version', 1, 'n', g, 'note', repeat('x', 960)),
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
FROM generate_series($1::bigint, $2::bigint - 1) g`

// scale is item 6: one database per level holds that many published rows (inserted with
// generate_series, then VACUUM ANALYZE). Then, batch after batch, each level in turn gets
// 100 new pending rows in one transaction, as writers add them, and a relay claims and
// marks them through Relay.PublishBatch with a publisher that confirms at once, so that
// only the database work is timed. Taking turns makes a busy machine slow the levels alike;
// the first batch of each level warms its connection and is not counted. The pending-rows
// index keeps the claim O(batch): its cost must not grow with the published rows.
func (e *env) scale(ctx context.Context, levels []int, batches int) []ScaleResult {
	out := make([]ScaleResult, len(levels))
	type level struct {
		relay          *outbox.Relay
		pool           *pgxpool.Pool
		claims, marks  []time.Duration
		claimedAt, end time.Time
	}
	ls := make([]*level, len(levels))
	defer func() { // free the disk for the phases after this one
		for i, l := range ls {
			if l != nil {
				l.pool.Close()
			}
			_ = e.dropDatabase(context.WithoutCancel(ctx), e.dbName(fmt.Sprintf("scale%d", i)))
		}
	}()
	for i, n := range levels {
		out[i].Published = n
		start := time.Now()
		l := &level{}
		relay, pool, err := e.scaleLevel(ctx, i, n, outbox.Hooks{
			Polled:    func(outbox.Poll) { l.claimedAt = time.Now() },
			BatchDone: func(outbox.BatchResult) { l.end = time.Now() },
		})
		if err != nil {
			out[i].Err = err
			continue
		}
		l.relay, l.pool, ls[i] = relay, pool, l
		e.progress("  %s published rows in %s", FormatCount(n), time.Since(start).Round(time.Millisecond))
	}
	for b := 0; b <= batches && ctx.Err() == nil; b++ {
		for i, l := range ls {
			if l == nil || out[i].Err != nil {
				continue
			}
			if err := writePending(ctx, l.pool, b); err != nil {
				out[i].Err = err
				continue
			}
			start := time.Now()
			n, err := l.relay.PublishBatch(ctx)
			switch {
			case err != nil:
				out[i].Err = err
			case n != 100:
				out[i].Err = fmt.Errorf("claimed %d rows, want 100", n)
			case b > 0:
				l.claims = append(l.claims, l.claimedAt.Sub(start)/100)
				l.marks = append(l.marks, l.end.Sub(l.claimedAt)/100)
			}
		}
	}
	for i, l := range ls {
		if l != nil && out[i].Err == nil {
			out[i].Claim, out[i].Mark = Median(l.claims), Median(l.marks)
			e.progress("  %s published rows: claim %s/row, mark %s/row", FormatCount(out[i].Published),
				FormatLatency(out[i].Claim), FormatLatency(out[i].Mark))
		}
	}
	return out
}

// scaleLevel creates the database of level i with published rows, analysed, and returns a
// relay on it with the hooks, and its pool.
func (e *env) scaleLevel(ctx context.Context, i, published int, hooks outbox.Hooks) (*outbox.Relay, *pgxpool.Pool, error) {
	suffix := fmt.Sprintf("scale%d", i)
	dbURL, err := e.createDatabase(ctx, suffix, "")
	if err != nil {
		return nil, nil, err
	}
	pool, err := openPool(ctx, dbURL, 1)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*outbox.Relay, *pgxpool.Pool, error) {
		pool.Close()
		return nil, nil, err
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fail(err)
	}
	for from := 0; from < published; from += 100_000 {
		if _, err := pool.Exec(ctx, fillPublished, from, min(published, from+100_000)); err != nil {
			return fail(fmt.Errorf("insert published rows: %w", err))
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_messages"); err != nil {
		return fail(fmt.Errorf("vacuum analyze: %w", err))
	}
	relay, err := outbox.NewRelay(pool, nullPublisher{}, outbox.Config{BatchSize: 100, DisableNotify: true, Hooks: hooks})
	if err != nil {
		return fail(err)
	}
	return relay, pool, nil
}

// writePending adds a batch of 100 pending rows, one aggregate each, in one transaction.
func writePending(ctx context.Context, pool *pgxpool.Pool, b int) error {
	msgs := make([]outbox.Message, 100)
	for j := range msgs {
		_, msgs[j] = orderEvent("bench.pending", b*100+j)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, msgs...) }); err != nil {
		return fmt.Errorf("write pending rows: %w", err)
	}
	return nil
}

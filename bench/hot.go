package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// HotResult is item 6b: what one aggregate's long backlog costs every claim.
type HotResult struct {
	// Backlog is the number of pending rows of each layout.
	Backlog int
	// Hot is the median claim of a batch of 100 when Backlog rows belong to one aggregate and
	// 100 other aggregates have a row each, written after them; Spread the same when every
	// row has an aggregate of its own.
	Hot, Spread time.Duration
	Err         error
}

// fillHot inserts $1 pending rows of aggregate $2, or of one aggregate each when $2 is
// NULL, numbered from $3.
const fillHot = `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), 'bench.pending', 'order.created', 'OrderCreated', 'order',
       coalesce($2, 'spread-' || g), json_build_object('version', 1, 'n', g, 'note', repeat('x', 960))
FROM generate_series($3::bigint, $3::bigint + $1 - 1) g`

// hot is item 6b. Two databases hold the same backlog: in one, all of it is one aggregate's
// (a customer whose events pile up behind a failing row, say) and 100 other aggregates
// follow; in the other, every row is an aggregate of its own. Batch after batch, in turns,
// each gets 100 new rows of new aggregates and a relay claims and marks a batch through
// Relay.PublishBatch with a publisher that confirms at once. The relay's maintenance takes
// the hot aggregate's later rows out of the claim's index during the first, unmeasured,
// batches; after that a claim must cost about the same in both.
func (e *env) hot(ctx context.Context, backlog, batches int) HotResult {
	res := HotResult{Backlog: backlog}
	type layout struct {
		relay          *outbox.Relay
		pool           *pgxpool.Pool
		started        time.Time
		claimedAt      time.Time
		claims         []time.Duration
		name, hotAggID string
	}
	layouts := []*layout{{name: "hot", hotAggID: "hot"}, {name: "spread"}}
	defer func() {
		for _, l := range layouts {
			if l.pool != nil {
				l.pool.Close()
				_ = e.dropDatabase(context.WithoutCancel(ctx), e.dbName(l.name))
			}
		}
	}()
	for _, l := range layouts {
		dbURL, err := e.createDatabase(ctx, l.name, "")
		if err == nil {
			l.pool, err = openPool(ctx, dbURL, 2)
		}
		if err == nil {
			err = outbox.Migrate(ctx, l.pool)
		}
		var agg any
		if l.hotAggID != "" {
			agg = l.hotAggID
		}
		if err == nil {
			_, err = l.pool.Exec(ctx, fillHot, backlog, agg, 0)
		}
		if err == nil && l.hotAggID != "" {
			_, err = l.pool.Exec(ctx, fillHot, 100, nil, backlog)
		}
		if err == nil {
			_, err = l.pool.Exec(ctx, "VACUUM ANALYZE outbox_messages")
		}
		if err == nil {
			l.relay, err = outbox.NewRelay(l.pool, nullPublisher{}, outbox.Config{BatchSize: 100, DisableNotify: true,
				Hooks: outbox.Hooks{Polled: func(outbox.Poll) { l.claimedAt = time.Now() }}})
		}
		if err != nil {
			res.Err = fmt.Errorf("%s layout: %w", l.name, err)
			return res
		}
	}
	const warmup = 20
	for b := 0; b < warmup+batches && ctx.Err() == nil; b++ {
		for _, l := range layouts {
			if err := writePending(ctx, l.pool, b); err != nil {
				res.Err = err
				return res
			}
			start := time.Now()
			if _, err := l.relay.PublishBatch(ctx); err != nil {
				res.Err = fmt.Errorf("%s layout: %w", l.name, err)
				return res
			}
			if b >= warmup {
				l.claims = append(l.claims, l.claimedAt.Sub(start))
			}
		}
	}
	res.Hot, res.Spread = Median(layouts[0].claims), Median(layouts[1].claims)
	return res
}

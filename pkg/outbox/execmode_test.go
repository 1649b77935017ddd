package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// failFirst fails the first publish of the messages of some aggregates with the error given
// for that aggregate, and publishes everything else.
type failFirst struct {
	outbox.Publisher
	mu     sync.Mutex
	errs   map[string]error
	failed map[string]bool
}

func (p *failFirst) Publish(ctx context.Context, msgs []outbox.Message) []error {
	out := make([]error, len(msgs))
	var send []outbox.Message
	var at []int
	p.mu.Lock()
	for i, m := range msgs {
		if err, ok := p.errs[m.AggregateID]; ok && !p.failed[m.AggregateID] {
			p.failed[m.AggregateID] = true
			out[i] = err
			continue
		}
		send, at = append(send, m), append(at, i)
	}
	p.mu.Unlock()
	if len(send) > 0 {
		for j, err := range p.Publisher.Publish(ctx, send) {
			out[at[j]] = err
		}
	}
	return out
}

// TestQueryExecModes runs the library on pools in every pgx query exec mode. A pool behind
// PgBouncer in transaction pooling uses exec or simple_protocol (no named prepared
// statements), and some adopters set describe_exec or cache_describe: every statement must
// bind its parameters in each of them. Each mode migrates, adds one message and several in
// one transaction (with Add, and with QueueAdd among other statements), publishes them,
// marks a failure and a refusal, buries a message, lists and requeues it, reads the stats
// and cleans up.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for mode := range testinfra.QueryExecModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testinfra.NewPoolInMode(t, mode)

			require.NoError(t, outbox.Migrate(ctx, pool))
			amqpURL := testinfra.AMQPURL(t)
			b := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(t, amqpURL), pub: newPublisher(t, amqpURL)}
			got := consume(t, amqpURL, b.top.Queue)

			pub := &failFirst{Publisher: b.pub, failed: map[string]bool{}, errs: map[string]error{
				"failed":    errors.New("a failure of its own: retried"),
				"refused":   fmt.Errorf("%w: refused for now", outbox.ErrRefused),
				"permanent": outbox.Permanent(errors.New("never publishable, until requeued")),
			}}
			var all []outbox.Message
			all = append(all, b.write(t, b.msg("single", 0))...)
			all = append(all, b.write(t, b.msg("several", 0), b.msg("several", 1), b.msg("failed", 0), b.msg("refused", 0))...)
			dead := b.write(t, b.msg("permanent", 0))[0]
			all = append(all, dead)
			// QueueAdd's statement among a caller's, one message and several: in
			// simple_protocol the batch is one string of statements.
			for _, queued := range [][]outbox.Message{{b.msg("queued", 0)}, {b.msg("queued", 1), b.msg("queued", 2)}} {
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var batch pgx.Batch
					batch.Queue("SELECT $1::text", "before")
					if err := outbox.QueueAdd(ctx, &batch, queued...); err != nil {
						return err
					}
					batch.Queue("SELECT $1::text", "after")
					return tx.SendBatch(ctx, &batch).Close()
				}))
				all = append(all, queued...)
			}

			cfg := fastConfig(t)
			b.startRelay(t, pool, pub, cfg)

			testinfra.Eventually(t, 30*time.Second, func() bool {
				return b.count(t, "dead_at IS NOT NULL") == 1 && b.count(t, "published_at IS NULL AND dead_at IS NULL") == 0
			}, "every row published but the permanent one, which is dead")
			listed, err := outbox.ListDead(ctx, pool, 10)
			require.NoError(t, err)
			require.Len(t, listed, 1)
			require.Equal(t, dead.ID, listed[0].ID)
			stats, err := outbox.ReadStats(ctx, pool)
			require.NoError(t, err)
			require.Equal(t, outbox.Stats{Dead: 1}, stats)

			n, err := outbox.Requeue(ctx, pool, dead.ID)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			testinfra.Eventually(t, 30*time.Second, func() bool {
				seen := got.ids()
				for _, m := range all {
					if seen[m.ID.String()] != 1 {
						return false
					}
				}
				return b.count(t, "published_at IS NULL") == 0
			}, "every message reached the queue once, the requeued one too")
			require.Equal(t, 1, b.count(t, "aggregate_id = 'failed' AND attempts = 1"), "the failure counted an attempt")
			require.Equal(t, 1, b.count(t, "aggregate_id = 'refused' AND attempts = 0 AND last_error LIKE '%refused for now%'"),
				"the refusal was recorded without an attempt")

			_, err = pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() - interval '30 days'")
			require.NoError(t, err)
			deleted, err := outbox.Cleanup(ctx, pool, outbox.CleanupConfig{})
			require.NoError(t, err)
			require.EqualValues(t, len(all), deleted)

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, outbox.CommitReplicated(ctx, tx))
		})
	}
}

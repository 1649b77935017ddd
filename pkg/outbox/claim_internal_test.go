package outbox

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// TestClaimCost holds the claim's cost on a long backlog to what batch.go and
// maintenance.go say of it: the claim transaction compiles nothing, whatever the planner
// estimates, and a maintenance pass looks at the oldest markWaitingWindow claimable rows
// only.
func TestClaimCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TheClaimTransactionCompilesNothing", func(t *testing.T) {
		// JIT on for every statement (jit_above_cost 0), as a long backlog makes it for the
		// claim on a server with default settings: after claimSettings, the claim's plan has
		// no JIT; without them, on a server that can compile, it has (so the test can see
		// JIT at all).
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, Migrate(ctx, pool))
		_, err := pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), 'x', 'k', 'T', 'order', g::text, '{}'::json FROM generate_series(1, 200) g`)
		require.NoError(t, err)
		var available bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available))

		jitIn := func(settings bool) bool {
			t.Helper()
			var plan json.RawMessage
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }() // the claim's locks go with it
			require.NoError(t, func() error {
				if _, err := tx.Exec(ctx, "SET LOCAL jit = on; SET LOCAL jit_above_cost = 0"); err != nil {
					return err
				}
				if settings {
					if _, err := tx.Exec(ctx, claimSettings, "5000", "5000", ""); err != nil {
						return err
					}
				}
				sql := defaultStore.sql.claimBatch
				if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, 100).Scan(&plan); err != nil {
					return err
				}
				return nil
			}())
			var out []map[string]any
			require.NoError(t, json.Unmarshal(plan, &out))
			_, jit := out[0]["JIT"]
			return jit
		}
		require.False(t, jitIn(true), "the claim compiled under claimSettings")
		if available {
			require.True(t, jitIn(false), "without claimSettings the claim compiles: the test sees JIT")
		} else {
			t.Log("this server cannot compile (pg_jit_available() is false): only the first half applies")
		}
	})

	t.Run("MaintenanceLooksAtTheOldestRowsOnly", func(t *testing.T) {
		// markWaitingWindow heads, then a hot aggregate of 10 rows: a pass finds nothing to
		// mark, as the hot rows lie beyond its window. Once the heads in front are published,
		// the hot rows come into the window and the next pass marks the nine behind the
		// first.
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, Migrate(ctx, pool))
		_, err := pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), 'x', 'k', 'T', 'order', 'a-' || g, '{}'::json FROM generate_series(1, $1::int) g`, markWaitingWindow)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
SELECT gen_random_uuid(), 'x', 'k', 'T', 'order', 'hot', '{}'::json FROM generate_series(1, 10)`)
		require.NoError(t, err)
		r, err := NewRelay(pool, &scripted{}, Config{DisableNotify: true})
		require.NoError(t, err)

		pass := func() int64 {
			t.Helper()
			tag, err := pool.Exec(ctx, r.sql.markWaiting, markWaitingLimit, markWaitingWindow)
			require.NoError(t, err)
			return tag.RowsAffected()
		}
		require.Zero(t, pass(), "the hot rows are beyond the window")
		_, err = pool.Exec(ctx, `UPDATE outbox_messages SET published_at = now() WHERE aggregate_id <> 'hot' AND seq <= (SELECT min(seq) + 99 FROM outbox_messages)`)
		require.NoError(t, err)
		require.EqualValues(t, 9, pass(), "the hot aggregate's rows behind its head")
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE waiting`).Scan(&waiting))
		require.Equal(t, 9, waiting)
	})
}

package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestQueryExecModes runs the inbox on pools in every pgx query exec mode, as the outbox's
// test of the same name does: a pool behind PgBouncer in transaction pooling uses exec or
// simple_protocol. Each mode migrates, processes a message, skips its redelivery, rolls back
// a failing handler's message, and cleans up.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for mode := range testinfra.QueryExecModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testinfra.NewPoolInMode(t, mode)

			require.NoError(t, inbox.Migrate(ctx, pool))
			_, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
			require.NoError(t, err)
			apply := func(id string) func(context.Context, pgx.Tx) error {
				return func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", "c", id)
					return err
				}
			}
			msg := inbox.Message{ID: "m-1", Type: "order.placed", ReceivedAt: time.Now()}
			dup, err := inbox.Process(ctx, pool, "c", msg, apply(msg.ID))
			require.NoError(t, err)
			require.False(t, dup)
			dup, err = inbox.Process(ctx, pool, "c", msg, apply(msg.ID))
			require.NoError(t, err)
			require.True(t, dup, "the redelivery is a duplicate")

			boom := errors.New("the handler failed")
			_, err = inbox.Process(ctx, pool, "c", inbox.Message{ID: "m-2"}, func(context.Context, pgx.Tx) error { return boom })
			require.ErrorIs(t, err, boom)
			dup, err = inbox.Process(ctx, pool, "c", inbox.Message{ID: "m-2"}, apply("m-2"))
			require.NoError(t, err)
			require.False(t, dup, "a failed handler's message is not recorded")
			require.Equal(t, 2, countRows(t, pool, "SELECT count(*) FROM effects"))

			_, err = pool.Exec(ctx, "UPDATE inbox_messages SET processed_at = now() - interval '30 days'")
			require.NoError(t, err)
			deleted, err := inbox.Cleanup(ctx, pool, inbox.CleanupConfig{})
			require.NoError(t, err)
			require.EqualValues(t, 2, deleted)
		})
	}
}

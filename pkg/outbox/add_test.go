package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TwiceIsFine", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, outbox.Migrate(ctx, pool))
		require.NoError(t, outbox.Migrate(ctx, pool))
	})

	t.Run("ConcurrentStarts", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		for range 5 {
			wg.Go(func() { errs <- outbox.Migrate(ctx, pool) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	})
}

func TestAdd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RolledBackTransactionLeavesNoRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		boom := errors.New("business rule failed")
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			require.NoError(t, outbox.Add(ctx, tx, b.msg("a", 1), b.msg("a", 2)))
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, b.count(t, "true"))
	})

	t.Run("CommittedRowsArePending", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		msgs := b.write(t, b.msg("a", 1), b.msg("b", 1))
		require.NotEqual(t, uuid.Nil, msgs[0].ID, "Add fills in the id")
		require.NotEqual(t, msgs[0].ID, msgs[1].ID)
		require.Equal(t, 2, b.count(t, "published_at IS NULL AND dead_at IS NULL AND attempts = 0"))
	})

	t.Run("KeepsGivenIDAndHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		m := b.msg("a", 1)
		m.ID = uuid.New()
		m.Headers = map[string]string{outbox.HeaderCorrelationID: "corr-1", outbox.HeaderTraceparent: "00-abc-def-01"}
		b.write(t, m)
		var headers map[string]string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT headers FROM outbox_messages WHERE id = $1", m.ID).Scan(&headers))
		require.Equal(t, m.Headers, headers)
	})

	t.Run("OneRowAndManyRowsAreStoredAlike", func(t *testing.T) {
		// One message takes a VALUES insert, several an unnest insert.
		t.Parallel()
		b := setup(t)
		one := b.msg("one", 1)
		one.Headers = map[string]string{outbox.HeaderCorrelationID: "corr"}
		many := []outbox.Message{b.msg("many", 1), b.msg("many", 2)}
		many[0].Headers = one.Headers
		one = b.write(t, one)[0]
		many = b.write(t, many...)
		const row = `SELECT exchange, routing_key, type, aggregate_type, payload::text, headers::text FROM outbox_messages WHERE id = $1`
		read := func(id uuid.UUID) []any {
			var ex, key, typ, agg, payload, headers string
			require.NoError(t, b.pool.QueryRow(ctx, row, id).Scan(&ex, &key, &typ, &agg, &payload, &headers))
			return []any{ex, key, typ, agg, payload, headers}
		}
		gotOne, gotMany := read(one.ID), read(many[0].ID)
		require.Equal(t, gotMany[:4], gotOne[:4])
		require.JSONEq(t, gotMany[5].(string), gotOne[5].(string))
		require.JSONEq(t, string(one.Payload), gotOne[4].(string))
		require.JSONEq(t, "{}", read(many[1].ID)[5].(string), "nil headers are stored as {}")
		var oneSeq, manySeq int64
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT seq FROM outbox_messages WHERE id = $1", one.ID).Scan(&oneSeq))
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT seq FROM outbox_messages WHERE id = $1", many[1].ID).Scan(&manySeq))
		require.Less(t, oneSeq, manySeq)
	})

	t.Run("RejectsInvalidMessagesBeforeWritingAny", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		good := b.msg("a", 1)
		for name, mutate := range map[string]func(*outbox.Message){
			"NoType":        func(m *outbox.Message) { m.Type = "" },
			"NoAggregateID": func(m *outbox.Message) { m.AggregateID = "" },
			"NoDestination": func(m *outbox.Message) { m.Exchange, m.RoutingKey = "", "" },
			"PayloadNotJSON": func(m *outbox.Message) {
				m.Payload = json.RawMessage(`{"unterminated"`)
			},
			"EmptyPayload": func(m *outbox.Message) { m.Payload = nil },
		} {
			t.Run(name, func(t *testing.T) {
				bad := b.msg("a", 2)
				mutate(&bad)
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					return outbox.Add(ctx, tx, good, bad)
				})
				require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			})
		}
		require.Zero(t, b.count(t, "true"))
	})
}

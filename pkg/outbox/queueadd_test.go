package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// errRollback rolls back the transaction of pgx.BeginFunc that returns it.
var errRollback = errors.New("roll back")

// sendQueued queues msgs with QueueAdd between two statements of the caller's on one batch,
// sends it in a transaction and commits it if every result is good: the errors of the
// caller's statements and of the outbox's, each in its place.
func sendQueued(ctx context.Context, t *testing.T, db *bundle, store *outbox.Store, msgs ...outbox.Message) (before, added, after error) {
	t.Helper()
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue("SELECT 1")
		n := b.Len()
		if store == nil {
			require.NoError(t, outbox.QueueAdd(ctx, &b, msgs...))
		} else {
			require.NoError(t, store.QueueAdd(ctx, &b, msgs...))
		}
		require.Equal(t, n+1, b.Len(), "one statement for the messages")
		b.Queue("SELECT 2")
		res := tx.SendBatch(ctx, &b)
		_, before = res.Exec()
		_, added = res.Exec()
		_, after = res.Exec()
		if err := res.Close(); err != nil {
			return err
		}
		if before != nil || added != nil || after != nil {
			return errRollback
		}
		return nil
	})
	if before == nil && added == nil && after == nil {
		require.NoError(t, err)
	}
	return before, added, after
}

// TestQueueAdd: messages queued on a caller's batch are the rows Add writes, written in one
// round trip with the caller's statements, refused the same way, and rolled back with the
// caller's transaction.
func TestQueueAdd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RowsLikeAdd", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		viaAdd := b.write(t, awkward(b, "agg")...)
		queued := awkward(b, "agg")
		before, inserted, after := sendQueued(ctx, t, b, nil, queued...)
		require.NoError(t, before)
		require.NoError(t, inserted)
		require.NoError(t, after)
		one := []outbox.Message{b.msg("agg", 9)}
		_, inserted, _ = sendQueued(ctx, t, b, nil, one...)
		require.NoError(t, inserted)
		for _, m := range append(queued, one...) {
			require.NotEqual(t, uuid.Nil, m.ID, "QueueAdd fills in the id, as Add does")
		}

		b.requireSameRows(t, viaAdd, queued)
		require.Equal(t, len(viaAdd)+len(queued)+1, b.count(t, "true"))
	})

	t.Run("RefusesLikeAddAndQueuesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		good := b.msg("a", 1)
		for name, mutate := range map[string]func(*outbox.Message){
			"NoType":         func(m *outbox.Message) { m.Type = "" },
			"PayloadNotJSON": func(m *outbox.Message) { m.Payload = []byte(`{"unterminated"`) },
			"NULInHeader":    func(m *outbox.Message) { m.Headers = map[string]string{"h": "a\x00"} },
			"ReservedHeader": func(m *outbox.Message) { m.Headers = map[string]string{outbox.HeaderAggregateID: "x"} },
		} {
			t.Run(name, func(t *testing.T) {
				bad := b.msg("a", 2)
				mutate(&bad)
				addErr := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, good, bad) })
				require.ErrorIs(t, addErr, outbox.ErrInvalidMessage)

				var batch pgx.Batch
				batch.Queue("SELECT 1")
				queueErr := outbox.QueueAdd(ctx, &batch, good, bad)
				require.ErrorIs(t, queueErr, outbox.ErrInvalidMessage)
				require.Equal(t, addErr.Error(), queueErr.Error())
				require.Equal(t, 1, batch.Len(), "nothing queued")
			})
		}
		require.Zero(t, b.count(t, "true"), "nothing written")
	})

	t.Run("NoMessageNoStatement", func(t *testing.T) {
		t.Parallel()
		var batch pgx.Batch
		require.NoError(t, outbox.QueueAdd(ctx, &batch))
		require.Zero(t, batch.Len())
	})

	// The statement's own failure (here a row whose id is already taken) is read in its
	// place among the batch's results; nothing of the batch is committed.
	t.Run("ItsErrorInItsPlace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		taken := b.write(t, b.msg("a", 1))[0]
		again := b.msg("a", 2)
		again.ID = taken.ID
		before, inserted, after := sendQueued(ctx, t, b, nil, again, b.msg("a", 3))
		require.NoError(t, before)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, inserted, &pgErr)
		require.Equal(t, "23505", pgErr.Code, "unique violation")
		require.Error(t, after, "the transaction is aborted after it")
		require.Equal(t, 1, b.count(t, "true"))
	})

	t.Run("RolledBackTransactionLeavesNoRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var batch pgx.Batch
			require.NoError(t, outbox.QueueAdd(ctx, &batch, b.msg("a", 1), b.msg("a", 2)))
			if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
				return err
			}
			return errRollback // a business rule failed after it
		})
		require.ErrorIs(t, err, errRollback)
		require.Zero(t, b.count(t, "true"))
	})

	t.Run("StoreTables", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		store, err := outbox.NewStore(outbox.Tables{Schema: "queued path", Messages: "events"})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx, b.pool))
		_, inserted, _ := sendQueued(ctx, t, b, store, b.msg("a", 1), b.msg("b", 1))
		require.NoError(t, inserted)
		st, err := store.ReadStats(ctx, b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Pending)
		require.Zero(t, b.count(t, "true"), "not the default table")
	})

	t.Run("RecordsTheTraceContext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tr := newTracing(t)
		sctx, span := tr.tp.Tracer("test").Start(ctx, "request")
		defer span.End()
		msgs := []outbox.Message{b.msg("order-1", 1)}
		_, inserted, _ := sendQueued(sctx, t, b, nil, msgs...)
		require.NoError(t, inserted)
		h := b.rowHeaders(t, msgs[0])
		stored := trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier(h)))
		require.Equal(t, span.SpanContext().TraceID(), stored.TraceID())
		require.Equal(t, span.SpanContext().SpanID(), stored.SpanID())
	})
}

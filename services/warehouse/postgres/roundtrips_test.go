package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// roundTrips counts what a connection sends and waits for: each query outside a batch and
// each batch.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRoundTrips: the handlers' statements, the outbox's answer included, go to PostgreSQL in
// as few round trips as their decisions allow, since a consumer's batch runs its messages'
// handlers one after another on one connection: a new order reserves in two (the order's
// lock with its reservation and the stock taken, then the records with the answer), a
// redelivered one is ignored in one, a cancellation releases in three; a short order of one
// line is rejected in three, of several in four (the savepoint's rollback). Counted on a
// connection that has prepared every statement already (the pool's statement cache), as a
// consumer's connections have after their first orders.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testinfra.DatabaseURL(t))
	require.NoError(t, err)
	var rt roundTrips
	cfg.ConnConfig.Tracer = &rt
	cfg.MaxConns = 1 // one connection, whose statement cache the warm-up fills
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	b := &bundle{pool: pool, store: store}
	b.setStock(t, map[string]int64{"BOOK-1": 10, "MUG-1": 10, "LAMP-1": 0})

	// apply runs fn in a transaction and returns the round trips between its BEGIN and its
	// COMMIT.
	apply := func(fn func(tx pgx.Tx) error) int64 {
		t.Helper()
		var n int64
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			start := rt.n.Load()
			err := fn(tx)
			n = rt.n.Load() - start
			return err
		}))
		return n
	}
	created := func(orderID uuid.UUID, lines []warehouse.Line, msgID string, want warehouse.Action) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			out, err := store.ApplyOrderCreated(ctx, tx, warehouse.OrderCreated{Header: events.Header{OrderID: orderID}, Lines: lines},
				warehouse.EventMeta{CausationID: msgID})
			require.Equal(t, want, out.Decision.Action)
			return err
		}
	}
	cancelled := func(orderID uuid.UUID, msgID string) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			out, err := store.ApplyOrderCancelled(ctx, tx, warehouse.OrderCancelled{Header: events.Header{OrderID: orderID}}, warehouse.EventMeta{CausationID: msgID})
			require.Equal(t, warehouse.ActionRelease, out.Decision.Action)
			return err
		}
	}
	lines := []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 1}}
	short := []warehouse.Line{{SKU: "LAMP-1", Quantity: 1}}
	shortOfTwo := []warehouse.Line{{SKU: "BOOK-1", Quantity: 1}, {SKU: "LAMP-1", Quantity: 1}}

	// The warm-up: every path once, on orders of its own.
	warm := uuid.Must(uuid.NewV7())
	apply(created(warm, lines, "w-1", warehouse.ActionReserve))
	apply(created(warm, lines, "w-1", warehouse.ActionIgnore))
	apply(cancelled(warm, "w-2"))
	apply(created(uuid.Must(uuid.NewV7()), short, "w-3", warehouse.ActionReject))
	apply(created(uuid.Must(uuid.NewV7()), shortOfTwo, "w-4", warehouse.ActionReject))

	orderID := uuid.Must(uuid.NewV7())
	require.EqualValues(t, 2, apply(created(orderID, lines, "m-1", warehouse.ActionReserve)), "a new order")
	require.Equal(t, warehouse.StatusReserved, b.reservation(t, orderID).Status)
	require.EqualValues(t, 1, apply(created(orderID, lines, "m-1", warehouse.ActionIgnore)), "a redelivery, ignored")
	require.EqualValues(t, 3, apply(cancelled(orderID, "c-1")), "a cancellation that releases")
	require.Equal(t, warehouse.StatusReleased, b.reservation(t, orderID).Status)
	require.EqualValues(t, 3, apply(created(uuid.Must(uuid.NewV7()), short, "m-2", warehouse.ActionReject)), "a short order of one line")
	require.EqualValues(t, 4, apply(created(uuid.Must(uuid.NewV7()), shortOfTwo, "m-3", warehouse.ActionReject)), "a short order of two lines")
	require.EqualValues(t, 10, b.available(t, "BOOK-1"))
	var answers int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages").Scan(&answers))
	require.Equal(t, 2*4, answers, "each answer written with its records (StockReserved, StockReleased, StockRejected)")
}

package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// bundle is a migrated database of a test's own and helpers on it.
type bundle struct {
	pool  *pgxpool.Pool
	store *postgres.Store
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	return &bundle{pool: pool, store: store}
}

// setStock sets the stock of skus (creating them).
func (b *bundle) setStock(t testing.TB, levels map[string]int64) {
	t.Helper()
	for sku, n := range levels {
		_, _, err := b.store.SetStock(context.Background(), sku, "", n)
		require.NoError(t, err)
	}
}

func (b *bundle) available(t *testing.T, sku string) int64 {
	t.Helper()
	item, err := b.store.GetStock(context.Background(), sku)
	require.NoError(t, err)
	return item.Available
}

// reserve runs postgres.Reserve in a transaction of its own, as the consumer would.
func (b *bundle) reserve(t *testing.T, orderID uuid.UUID, lines []warehouse.Line) warehouse.Decision {
	t.Helper()
	var d warehouse.Decision
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		d, err = postgres.Reserve(context.Background(), tx, orderID, warehouse.MergeLines(lines), "created-"+orderID.String(), time.Now())
		return err
	})
	require.NoError(t, err)
	return d
}

// release runs postgres.Release in a transaction of its own, with message id msgID.
func (b *bundle) release(t *testing.T, orderID uuid.UUID, msgID string) (warehouse.Decision, []warehouse.Line) {
	t.Helper()
	var (
		d     warehouse.Decision
		lines []warehouse.Line
	)
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		d, lines, err = postgres.Release(context.Background(), tx, orderID, msgID, time.Now())
		return err
	})
	require.NoError(t, err)
	return d, lines
}

func (b *bundle) reservation(t *testing.T, orderID uuid.UUID) warehouse.Reservation {
	t.Helper()
	r, err := b.store.GetReservation(context.Background(), orderID)
	require.NoError(t, err)
	return r
}

// movements counts the ledger rows of an order.
func (b *bundle) movements(t *testing.T, orderID uuid.UUID) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT kind, count(*)::int FROM stock_movements WHERE order_id = $1 GROUP BY kind`, orderID)
	require.NoError(t, err)
	out := map[string]int{}
	var (
		kind string
		n    int
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &n}, func() error { out[kind] = n; return nil })
	require.NoError(t, err)
	return out
}

// requireConsistent fails the test when postgres.Verify finds a problem.
func (b *bundle) requireConsistent(t *testing.T) {
	t.Helper()
	problems, err := postgres.Verify(context.Background(), b.pool)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func newOrderID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

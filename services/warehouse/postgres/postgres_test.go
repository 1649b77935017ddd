package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("seeds the catalogue with a ledger row per SKU", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		items, err := b.store.ListStock(context.Background(), "", 100)
		require.NoError(t, err)
		var got []warehouse.CatalogueItem
		for _, i := range items {
			got = append(got, warehouse.CatalogueItem{SKU: i.SKU, Name: i.Name, Available: i.Available})
			require.Zero(t, i.Reserved)
		}
		require.Equal(t, warehouse.Catalogue, got, "migrations/002_catalogue.sql and warehouse.Catalogue must agree")
		var restocks int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM stock_movements WHERE kind = 'restock'`).Scan(&restocks))
		require.Equal(t, len(warehouse.Catalogue), restocks)
		b.requireConsistent(t)
	})

	t.Run("is idempotent, also run concurrently, and does not seed twice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, err := b.store.SetStock(context.Background(), "BOOK-1", "", 7)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() { errs <- postgres.Migrate(context.Background(), b.pool) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(7), b.available(t, "BOOK-1"))
		var versions int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM warehouse_schema_migrations`).Scan(&versions))
		require.Equal(t, 3, versions)
	})

	t.Run("stock can never go negative", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(context.Background(), `UPDATE stock SET available = available - 11 WHERE sku = 'BAG-1'`)
		pgErr, ok := errors.AsType[*pgconn.PgError](err)
		require.True(t, ok, "want a check violation, got %v", err)
		require.Equal(t, "23514", pgErr.Code)
	})
}

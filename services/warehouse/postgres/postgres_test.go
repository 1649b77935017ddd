package postgres_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
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
		require.Equal(t, []int{1, 2, 3}, schemaVersions(t, b.pool))
	})

	// A database the runner before migrated (files applied and their names recorded in
	// warehouse_schema_migrations; here all but the last): its record is taken over, and only
	// the files after it are applied.
	t.Run("takes over the record of the runner before", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := testinfra.NewPool(t)
		_, err := pool.Exec(ctx, `CREATE TABLE warehouse_schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
		require.NoError(t, err)
		files, err := filepath.Glob("migrations/*.sql")
		require.NoError(t, err)
		require.Len(t, files, 3)
		for _, file := range files[:len(files)-1] {
			sql, err := os.ReadFile(file)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, string(sql))
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `INSERT INTO warehouse_schema_migrations (version) VALUES ($1)`, strings.TrimSuffix(filepath.Base(file), ".sql"))
			require.NoError(t, err)
		}
		require.NoError(t, postgres.Migrate(ctx, pool), "001_schema.sql again would fail: its tables exist")
		require.Equal(t, []int{1, 2, 3}, schemaVersions(t, pool))
		var version int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM stock WHERE sku = 'BOOK-1'`).Scan(&version), "003_stock_version.sql applied")
		var restocks int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stock_movements WHERE kind = 'restock'`).Scan(&restocks))
		require.Equal(t, len(warehouse.Catalogue), restocks, "the catalogue seeded once")
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

// schemaVersions returns the versions warehouse_schema_version records, in order.
func schemaVersions(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT version FROM warehouse_schema_version ORDER BY version`)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return versions
}

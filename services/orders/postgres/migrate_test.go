package postgres_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = postgres.Migrate(ctx, pool) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, postgres.Migrate(ctx, pool), "a second start migrates again")

	rows, err := pool.Query(ctx, `SELECT sku, name FROM products ORDER BY sku`)
	require.NoError(t, err)
	products, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ SKU, Name string }])
	require.NoError(t, err)
	require.Equal(t, []struct{ SKU, Name string }{
		{"BAG-1", "Saga tote bag"},
		{"BOOK-1", "The Go Programming Language"},
		{"MUG-1", "Outbox mug"},
		{"PEN-1", "Idempotent pen"},
		{"TEE-1", "Inbox T-shirt"},
	}, products)

	require.Equal(t, []int{1, 2}, schemaVersions(t, pool))

	for _, table := range []string{"orders", "order_lines", "order_status_history", "idempotency_keys", "outbox_messages", "inbox_messages"} {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
		require.True(t, exists, table)
	}
}

// TestMigrateTakesOverTheOldRecord: on a database the runner before migrated (files applied
// and their names recorded in orders_schema_migrations; here all but the last), Migrate
// records their versions in orders_schema_version, applies only the files after them, and
// then nothing again.
func TestMigrateTakesOverTheOldRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE orders_schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	files, err := filepath.Glob("migrations/*.sql")
	require.NoError(t, err)
	require.Len(t, files, 2)
	for _, file := range files[:len(files)-1] {
		sql, err := os.ReadFile(file)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(sql))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO orders_schema_migrations (version) VALUES ($1)`, strings.TrimSuffix(filepath.Base(file), ".sql"))
		require.NoError(t, err)
	}

	require.NoError(t, postgres.Migrate(ctx, pool), "001_orders.sql again would fail: its tables exist")
	require.Equal(t, []int{1, 2}, schemaVersions(t, pool))
	var products int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM products`).Scan(&products))
	require.Equal(t, 5, products, "002_products.sql applied")
	require.NoError(t, postgres.Migrate(ctx, pool))
	require.Equal(t, []int{1, 2}, schemaVersions(t, pool))
}

// schemaVersions returns the versions orders_schema_version records, in order.
func schemaVersions(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT version FROM orders_schema_version ORDER BY version`)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return versions
}

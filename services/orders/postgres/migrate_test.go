package postgres_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
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

	var versions []string
	rows, err = pool.Query(ctx, `SELECT version FROM orders_schema_migrations ORDER BY version`)
	require.NoError(t, err)
	versions, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"001_orders", "002_products"}, versions)

	for _, table := range []string{"orders", "order_lines", "order_status_history", "idempotency_keys", "outbox_messages", "inbox_messages"} {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
		require.True(t, exists, table)
	}
}

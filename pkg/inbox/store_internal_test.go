package inbox

import (
	"context"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestStatementsNameTheirTables prepares every statement of a Store on an inbox in schema
// billing, on connections whose search_path does not name billing, in a database without
// the default tables: a statement that still named the default table, or left its table
// unqualified, fails to prepare (42P01). Every field of statements is prepared, so a
// statement added later is checked too.
func TestStatementsNameTheirTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	for _, tables := range []Tables{
		{Schema: "billing"},
		{Schema: `Billing "EU"`, Messages: "Inbox Messages"},
	} {
		s, err := NewStore(tables)
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx, pool))
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(conn.Release) // before the pool closes, even when a check fails
		var searchPath string
		require.NoError(t, conn.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
		require.NotContains(t, searchPath, "illing")

		v := reflect.ValueOf(s.sql)
		for i := range v.NumField() {
			name, sql := v.Type().Field(i).Name, v.Field(i).String()
			require.NotEmpty(t, sql, "statement %s", name)
			_, err := conn.Conn().Prepare(ctx, "", sql)
			require.NoError(t, err, "statement %s of %s", name, s.Tables())
		}
	}
	var defaults bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('inbox_messages') IS NOT NULL").Scan(&defaults))
	require.False(t, defaults, "the default table was never created")
}

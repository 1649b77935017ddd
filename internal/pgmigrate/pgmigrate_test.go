package pgmigrate_test

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestService(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t)
	ctx := context.Background()
	fsys := fstest.MapFS{
		"migrations/001_things.sql": {Data: []byte("CREATE TABLE things (id int PRIMARY KEY);")},
		"migrations/002_rows.sql":   {Data: []byte("INSERT INTO things VALUES (1);")},
	}
	require.NoError(t, pgmigrate.Service(ctx, pool, "kit", fsys, 42))
	require.NoError(t, pgmigrate.Service(ctx, pool, "kit", fsys, 42), "again: nothing left to do")

	var things, applied int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM things").Scan(&things))
	require.Equal(t, 1, things, "each file applied once")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM kit_schema_migrations").Scan(&applied))
	require.Equal(t, 2, applied)
	for _, table := range []string{"outbox_messages", "inbox_messages"} {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists))
		require.True(t, exists, "%s created", table)
	}
}

package testinfra_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// TestPostgresPair fails over a pair: a row committed on the primary is on the promoted
// standby, which a multi-host URL reaches for writes; before the promotion it refuses them.
func TestPostgresPair(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pair := testinfra.StartPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "pair")

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var port int
	require.NoError(t, conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
	require.Equal(t, pair.Primary.Port, port, "read-write lands on the primary")
	_, err = conn.Exec(ctx, "CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	pair.KillPrimary(t)
	_, err = pgx.Connect(ctx, dbURL)
	require.Error(t, err, "only the standby is up: no server takes writes")

	pair.Promote(t)
	conn, err = pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
	require.Equal(t, pair.Standby.Port, port)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 1, n, "the row committed on the primary survived its loss")
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (2)")
	require.NoError(t, err, "the promoted standby takes writes at once: it waits for no standby")
}

package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// missingDatabaseURL returns the URL of a database that does not exist yet, dropped when the
// test ends.
func missingDatabaseURL(t *testing.T) string {
	t.Helper()
	admin := testinfra.PostgresURL(t)
	u, err := url.Parse(admin)
	require.NoError(t, err)
	name := testinfra.UniqueName(t, "new")
	if len(name) > 63 {
		name = name[:63]
	}
	u.Path = "/" + name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	return u.String()
}

func TestConnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CreatesTheDatabase", func(t *testing.T) {
		t.Parallel()
		dbURL := missingDatabaseURL(t)
		pool, err := postgres.Connect(ctx, dbURL, postgres.PoolConfig{})
		require.NoError(t, err)
		defer pool.Close()
		require.NoError(t, postgres.Migrate(ctx, pool))
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM products`).Scan(&n))
		require.Equal(t, 5, n)
	})

	t.Run("ConcurrentCreators", func(t *testing.T) {
		t.Parallel()
		dbURL := missingDatabaseURL(t)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				pool, err := postgres.Connect(ctx, dbURL, postgres.PoolConfig{MaxConns: 2})
				if err == nil {
					err = postgres.Migrate(ctx, pool)
					pool.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "creator %d", i)
		}
	})

	t.Run("ExistingDatabase", func(t *testing.T) {
		t.Parallel()
		pool, err := postgres.Connect(ctx, testinfra.DatabaseURL(t), postgres.PoolConfig{})
		require.NoError(t, err)
		pool.Close()
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there now
		_, err = postgres.Connect(ctx, "postgres://postgres@"+addr+"/orders?sslmode=disable",
			postgres.PoolConfig{ConnectTimeout: time.Second})
		require.Error(t, err)
		require.True(t, postgres.IsUnavailable(err), "error: %v", err)
	})
}

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

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"Plain", errors.New("boom"), false},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, false},
		{"SyntaxError", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "42601"}), false},
		{"ConnectionFailure", &pgconn.PgError{Code: "08006"}, true},
		{"AdminShutdown", fmt.Errorf("q: %w", &pgconn.PgError{Code: "57P01"}), true},
		{"CannotConnectNow", &pgconn.PgError{Code: "57P03"}, true},
		{"TooManyConnections", &pgconn.PgError{Code: "53300"}, true},
		{"DeadlineExceeded", fmt.Errorf("acquire: %w", context.DeadlineExceeded), true},
		{"UnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"ConnClosed", fmt.Errorf("q: %w", pgconn.ErrConnClosed), true},
		{"NetError", &net.OpError{Op: "dial", Err: timeoutErr{}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, postgres.IsUnavailable(tc.err))
		})
	}
}

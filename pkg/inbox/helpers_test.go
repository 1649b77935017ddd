package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// newMigratedPool returns a pool on a fresh database with the inbox schema and an effects
// table in which test handlers record what they did.
func newMigratedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testinfra.NewPool(t)
	ctx := context.Background()
	require.NoError(t, inbox.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	return pool
}

func countRows(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// recordHandler is a slog.Handler that keeps every record, for tests that look at logs.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// int64Attrs returns the value of attribute key of every record with message msg.
func (h *recordHandler) int64Attrs(msg, key string) []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.Int64())
			}
			return true
		})
	}
	return out
}

// failingBeginner fails the test when Process begins a transaction.
type failingBeginner struct{ t testing.TB }

func (f failingBeginner) Begin(context.Context) (pgx.Tx, error) {
	f.t.Error("Process began a transaction")
	return nil, errors.New("no transaction expected")
}

// hostPort returns the host:port of a PostgreSQL URL.
func hostPort(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	if u.Port() == "" {
		return u.Hostname() + ":5432"
	}
	return u.Host
}

// latin1Pool returns a pool of UTF-8 clients on a fresh LATIN1 database, dropped when the
// test ends.
func latin1Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin := testinfra.PostgresURL(t)
	name := testinfra.UniqueName(t, "latin1")
	if len(name) > 63 {
		name = name[:63]
	}
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	// A UTF-8 client, so that the server converts what it is sent into LATIN1.
	q := u.Query()
	q.Set("client_encoding", "UTF8")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

package inbox_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

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

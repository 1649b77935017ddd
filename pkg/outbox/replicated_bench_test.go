package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// BenchmarkCommitReplicated is the price of acknowledging only what is replicated: a
// transaction that reads one row, committed plainly and with CommitReplicated, on the test
// server (local: no synchronous standby) and on a private primary with a synchronous
// standby (pair). The relay pays the same per cycle, on a pair only, for the barrier it
// commits between its claim and its publish; inbox.Process pays the extra statement per
// message, and on a pair the commit record when the message is a duplicate.
func BenchmarkCommitReplicated(b *testing.B) {
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(b)
	pairPool, err := pgxpool.New(ctx, pair.CreateDatabase(b, "bench_replicated"))
	require.NoError(b, err)
	b.Cleanup(pairPool.Close)
	commits := map[string]func(context.Context, pgx.Tx) error{
		"plain":      func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		"replicated": outbox.CommitReplicated,
	}
	for _, server := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"local", testinfra.NewPool(b)}, {"pair", pairPool}} {
		for _, commit := range []string{"plain", "replicated"} {
			b.Run(server.name+"/"+commit, func(b *testing.B) {
				for b.Loop() {
					tx, err := server.pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					var one int
					if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
						b.Fatal(err)
					}
					if err := commits[commit](ctx, tx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders"
)

// BenchmarkAcknowledge is the price of acknowledging only what is replicated (issue 24):
// the two answers that only read — the idempotent replay of POST /orders (claim the key,
// read its stored answer) and GET /orders/{id} (the order, its lines, its history) — in a
// transaction committed plainly (plain) and through pgdb.InTx (replicated), one request at
// a time, on the test server (local: no synchronous standby) and on a private primary with
// a synchronous standby (pair). docs/benchmarks.md has the numbers.
func BenchmarkAcknowledge(b *testing.B) {
	ctx := context.Background()
	local := testinfra.NewPool(b)
	pair := testinfra.StartPostgresPair(b)
	pairPool, err := pgxpool.New(ctx, pair.CreateDatabase(b, "orders"))
	require.NoError(b, err)
	b.Cleanup(pairPool.Close)

	inTx := map[string]func(ctx context.Context, db pgdb.TxBeginner, opts pgx.TxOptions, fn func(pgx.Tx) error) error{
		"plain": func(ctx context.Context, db pgdb.TxBeginner, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
			return pgx.BeginTxFunc(ctx, db, opts, fn)
		},
		"replicated": pgdb.InTx,
	}
	for _, server := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"local", local}, {"pair", pairPool}} {
		require.NoError(b, Migrate(ctx, server.pool))
		store, err := NewStore(server.pool, StoreConfig{Exchange: "bench.events"})
		require.NoError(b, err)
		key := &orders.IdempotencyKey{Key: "bench-1", Fingerprint: []byte("fingerprint")}
		res, err := store.CreateOrder(ctx, orders.CreateOrderInput{
			Request:     orders.OrderRequest{CustomerID: "c-1", Items: []orders.Item{{SKU: "BOOK-1", Quantity: 1}, {SKU: "MUG-1", Quantity: 2}}},
			Idempotency: key,
			Render: func(*orders.Order) (orders.Response, error) {
				return orders.Response{Status: 201, Body: []byte(`{}`)}, nil
			},
		})
		require.NoError(b, err)

		for _, commit := range []string{"plain", "replicated"} {
			b.Run(server.name+"/replay/"+commit, func(b *testing.B) {
				for b.Loop() {
					err := inTx[commit](ctx, server.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
						replay, err := claimIdempotencyKey(ctx, tx, key)
						if err == nil && replay == nil {
							b.Fatal("the key was not replayed")
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(server.name+"/get/"+commit, func(b *testing.B) {
				for b.Loop() {
					err := inTx[commit](ctx, server.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
						_, err := loadOrder(ctx, tx, res.OrderID)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

package postgres_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
	"github.com/outboxshop/outboxshop/services/orders"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// txDB runs a Store inside one open transaction: each of its methods' transactions is a
// savepoint, so the test sees what a method wrote before anything commits.
type txDB struct{ pgx.Tx }

func (d txDB) BeginTx(ctx context.Context, _ pgx.TxOptions) (pgx.Tx, error) { return d.Begin(ctx) }
func (d txDB) Ping(ctx context.Context) error                               { return d.Conn().Ping(ctx) }

// txStore returns a Store on a transaction of b's database, rolled back when the test ends.
func (b *storeBundle) txStore(t *testing.T) (*postgres.Store, pgx.Tx) {
	t.Helper()
	return b.txStoreOf(t, postgres.StoreConfig{Exchange: testExchange})
}

// txStoreOf is txStore with a configuration of the test's.
func (b *storeBundle) txStoreOf(t *testing.T, cfg postgres.StoreConfig) (*postgres.Store, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	store, err := postgres.NewStore(txDB{tx}, cfg)
	require.NoError(t, err)
	return store, tx
}

// TestStoreOutbox asserts, with the outbox's test helpers, the events that creating and
// cancelling an order add to the outbox in the order's transaction.
func TestStoreOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CreateAddsOrderCreated", func(t *testing.T) {
		t.Parallel()
		store, tx := setup(t).txStore(t)
		res, err := store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{{SKU: "MUG-1", Quantity: 3}}},
			Meta:    orders.EventMeta{CorrelationID: "req-1", CausationID: "cause-1"},
		})
		require.NoError(t, err)
		o := res.Order
		outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
			Type:          orders.EventOrderCreated,
			Exchange:      testExchange,
			RoutingKey:    orders.RoutingKeyOrderCreated,
			AggregateType: orders.AggregateType,
			AggregateID:   o.ID.String(),
			Payload: orders.OrderCreated{
				Version: orders.EventVersion, OrderID: o.ID, CustomerID: "c-42",
				Items: []orders.EventItem{{SKU: "MUG-1", Quantity: 3}}, CreatedAt: o.CreatedAt.UTC(),
			},
			Headers: map[string]string{outbox.HeaderCorrelationID: "req-1", outbox.HeaderCausationID: "cause-1"},
		}, nil)
		outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{Type: orders.EventOrderCancelled}, nil)
	})

	t.Run("CreateAddsOrderCreatedOfTheVersionConfigured", func(t *testing.T) {
		t.Parallel()
		store, tx := setup(t).txStoreOf(t, postgres.StoreConfig{Exchange: testExchange, OrderCreatedVersion: orders.OrderCreatedV2})
		res, err := store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{{SKU: "MUG-1", Quantity: 3}, {SKU: "BOOK-1", Quantity: 1}}},
		})
		require.NoError(t, err)
		o := res.Order
		outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
			Type: orders.EventOrderCreated, AggregateID: o.ID.String(),
			Payload: orders.OrderCreatedV2Event{
				Version: orders.OrderCreatedV2, OrderID: o.ID, Customer: orders.EventCustomer{ID: "c-42"},
				Lines: []orders.EventItem{{SKU: "MUG-1", Quantity: 3}, {SKU: "BOOK-1", Quantity: 1}}, CreatedAt: o.CreatedAt.UTC(),
			},
		}, nil)
	})

	t.Run("AVersionOfOrderCreatedThatDoesNotExistIsRefused", func(t *testing.T) {
		t.Parallel()
		for _, v := range []int{-1, 3} {
			_, err := postgres.NewStore(txDB{}, postgres.StoreConfig{Exchange: testExchange, OrderCreatedVersion: v})
			require.ErrorContains(t, err, "OrderCreated has versions [1 2]")
		}
	})

	t.Run("UnknownSKUAddsNothing", func(t *testing.T) {
		t.Parallel()
		store, tx := setup(t).txStore(t)
		_, err := store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{{SKU: "NOPE-1", Quantity: 1}}},
		})
		require.Equal(t, orders.CodeValidation, orders.ErrorCode(err), "error: %v", err)
		outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{}, nil)
	})

	t.Run("CancelAddsOrderCancelledOnce", func(t *testing.T) {
		t.Parallel()
		store, tx := setup(t).txStore(t)
		res, err := store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{{SKU: "BOOK-1", Quantity: 1}}},
		})
		require.NoError(t, err)
		id := res.OrderID.String()
		_, err = store.CancelOrder(ctx, res.OrderID, orders.EventMeta{CorrelationID: "req-cancel"})
		require.NoError(t, err)
		_, err = store.CancelOrder(ctx, res.OrderID, orders.EventMeta{CorrelationID: "req-cancel-2"})
		require.NoError(t, err, "cancelling twice is not an error")

		added := outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{
			{Type: orders.EventOrderCreated, AggregateID: id},
			{
				Type: orders.EventOrderCancelled, RoutingKey: orders.RoutingKeyOrderCancelled, AggregateID: id,
				Headers: map[string]string{outbox.HeaderCorrelationID: "req-cancel"},
			},
		}, nil)
		var ev orders.OrderCancelled
		require.NoError(t, json.Unmarshal(added[1].Payload, &ev))
		require.Equal(t, res.OrderID, ev.OrderID)
		require.Equal(t, orders.EventVersion, ev.Version)
		require.False(t, ev.CancelledAt.IsZero())
	})
}

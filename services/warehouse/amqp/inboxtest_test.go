package amqp_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqtest"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxtest"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// TestHandlerWithoutBroker runs the consumer's handler on deliveries through the inbox with
// the libraries' test helpers, without RabbitMQ: what each delivery writes to the outbox,
// what a redelivery does, and what the consumer makes of the handler's errors.
func TestHandlerWithoutBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const exchange = "test.events"
	setupDB := func(t *testing.T) (*pgxpool.Pool, inboxrabbitmq.Config) {
		t.Helper()
		pool := testinfra.NewPool(t)
		require.NoError(t, postgres.Migrate(ctx, pool))
		store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: exchange})
		require.NoError(t, err)
		h := warehouseamqp.NewHandler(store, warehouseamqp.HandlerConfig{Logger: testLogger(t)})
		return pool, inboxrabbitmq.Config{Name: warehouseamqp.ConsumerName, Handler: h, MaxDeliveries: 3}
	}
	delivery := func(m message) inboxrabbitmq.Delivery {
		return inboxrabbitmq.Delivery{ID: m.ID, Type: m.Type, Body: m.Body, CorrelationID: "req-7", DeliveryCount: 1}
	}
	// addedOne expects exactly one event of typ for the order in the inbox transaction, and
	// decodes its payload into v.
	addedOne := func(t *testing.T, d inboxrabbitmq.Delivery, orderID uuid.UUID, typ, routingKey string, v any) *inboxtest.Options {
		return &inboxtest.Options{BeforeCommit: func(ctx context.Context, tx pgx.Tx) {
			m := outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
				Type: typ, Exchange: exchange, RoutingKey: routingKey,
				AggregateType: warehouse.AggregateType, AggregateID: orderID.String(),
				Headers: map[string]string{outbox.HeaderCorrelationID: "req-7", outbox.HeaderCausationID: d.ID},
			}, nil)
			require.NoError(t, json.Unmarshal(m.Payload, v))
			outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{{ID: m.ID}}, nil)
		}}
	}

	t.Run("OrderCreatedReservesOnceAndAnswersStockReserved", func(t *testing.T) {
		t.Parallel()
		pool, cfg := setupDB(t)
		id := uuid.Must(uuid.NewV7())
		d := delivery(orderCreated(t, id, warehouse.Line{SKU: "BOOK-1", Quantity: 2}))
		var ev warehouse.StockReserved
		first := inboxrabbitmqtest.RequireHandledOnce(ctx, t, pool, cfg, d,
			addedOne(t, d, id, warehouse.TypeStockReserved, warehouse.RoutingKeyStockReserved, &ev))
		require.True(t, first.Called)
		require.Equal(t, id, ev.OrderID)
		require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}}, ev.Items)

		var available int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT available FROM stock WHERE sku = 'BOOK-1'`).Scan(&available))
		require.Equal(t, int64(98), available, "reserved once, although delivered twice")
	})

	t.Run("OrderCreatedWithoutStockAnswersStockRejected", func(t *testing.T) {
		t.Parallel()
		pool, cfg := setupDB(t)
		id := uuid.Must(uuid.NewV7())
		d := delivery(orderCreated(t, id, warehouse.Line{SKU: "BOOK-1", Quantity: 1000}))
		var ev warehouse.StockRejected
		inboxrabbitmqtest.Deliver(ctx, pool, cfg, d, addedOne(t, d, id, warehouse.TypeStockRejected, warehouse.RoutingKeyStockRejected, &ev)).
			RequireOutcome(t, inboxrabbitmqtest.Acked, "")
		require.Equal(t, warehouse.ReasonInsufficientStock, ev.Reason)
		require.Equal(t, []warehouse.Shortage{{SKU: "BOOK-1", Requested: 1000, Available: 100}}, ev.Shortages)
	})

	t.Run("OrderCancelledAnswersStockReleased", func(t *testing.T) {
		t.Parallel()
		pool, cfg := setupDB(t)
		id := uuid.Must(uuid.NewV7())
		inboxrabbitmqtest.Deliver(ctx, pool, cfg, delivery(orderCreated(t, id, warehouse.Line{SKU: "TEE-1", Quantity: 3})), nil).
			RequireOutcome(t, inboxrabbitmqtest.Acked, "")
		d := delivery(orderCancelled(t, id))
		var ev warehouse.StockReleased
		inboxrabbitmqtest.RequireHandledOnce(ctx, t, pool, cfg, d,
			addedOne(t, d, id, warehouse.TypeStockReleased, warehouse.RoutingKeyStockReleased, &ev))
		require.Equal(t, []warehouse.Line{{SKU: "TEE-1", Quantity: 3}}, ev.Items)
	})

	t.Run("SecondOrderCreatedAddsNothing", func(t *testing.T) {
		t.Parallel()
		pool, cfg := setupDB(t)
		id := uuid.Must(uuid.NewV7())
		inboxrabbitmqtest.Deliver(ctx, pool, cfg, delivery(orderCreated(t, id, warehouse.Line{SKU: "MUG-1", Quantity: 1})), nil).
			RequireOutcome(t, inboxrabbitmqtest.Acked, "")
		// Another message for the same order: new to the inbox, but it changes nothing.
		again := delivery(orderCreated(t, id, warehouse.Line{SKU: "MUG-1", Quantity: 5}))
		h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, again, &inboxtest.Options{BeforeCommit: func(ctx context.Context, tx pgx.Tx) {
			outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{}, nil)
		}})
		h.RequireOutcome(t, inboxrabbitmqtest.Acked, "")
		require.True(t, h.Called)
	})

	t.Run("BrokenMessagesAreDeadLettered", func(t *testing.T) {
		t.Parallel()
		pool, cfg := setupDB(t)
		for name, d := range map[string]inboxrabbitmq.Delivery{
			"unknown type":    {ID: uuid.NewString(), Type: "OrderShipped", Body: []byte(`{}`)},
			"broken contract": {ID: uuid.NewString(), Type: warehouse.TypeOrderCreated, Body: []byte(`{"version":1,"order_id":"nope"}`)},
			"future version":  {ID: uuid.NewString(), Type: warehouse.TypeOrderCancelled, Body: []byte(`{"version":99,"order_id":"` + uuid.NewString() + `"}`)},
		} {
			h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, d, nil)
			h.RequireOutcome(t, inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonPermanent)
			require.True(t, h.Called, name)
			// Rolled back, inbox row included: the dead letter can be replayed once fixed.
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, d.ID).Scan(&n))
			require.Zero(t, n, name)
		}
	})
}

package amqp_test

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
)

// TestHandlerConcurrentOrders calls the handler through inbox.Process from 50 goroutines at
// once, as 50 consumers would: exactly the stock there is gets reserved.
func TestHandlerConcurrentOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, _, err := b.store.SetStock(ctx, "HOT-1", "Hot item", 10)
	require.NoError(t, err)
	h := warehouseamqp.NewHandler(b.store, warehouseamqp.HandlerConfig{Logger: testLogger(t)})

	msgs := make([]message, 50)
	for i := range msgs {
		msgs[i] = orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "HOT-1", Quantity: 1})
	}
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Go(func() {
			_, err := inbox.Process(ctx, b.pool, warehouseamqp.ConsumerName, inbox.Message{ID: m.ID, Type: m.Type},
				func(ctx context.Context, tx pgx.Tx) error {
					return h(ctx, tx, inboxrabbitmq.Delivery{ID: m.ID, Type: m.Type, Body: m.Body, DeliveryCount: 1})
				})
			assert.NoError(t, err) // not require: this is not the test's goroutine
		})
	}
	wg.Wait()

	require.Equal(t, 10, b.countReservations(t, warehouse.StatusReserved))
	require.Equal(t, 40, b.countReservations(t, warehouse.StatusRejected))
	require.Zero(t, b.available(t, "HOT-1"))
	require.Equal(t, 10, b.countAnswers(t, warehouse.TypeStockReserved))
	require.Equal(t, 40, b.countAnswers(t, warehouse.TypeStockRejected))
	b.requireConsistent(t)
}

func TestConsumer(t *testing.T) {
	t.Parallel()

	t.Run("50 concurrent orders for 10 in stock: 10 reserved, 40 rejected, stock 0", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, err := b.store.SetStock(context.Background(), "HOT-1", "Hot item", 10)
		require.NoError(t, err)
		b.startConsumer(t, 16)
		for range 50 {
			b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "HOT-1", Quantity: 1}))
		}
		testinfra.Eventually(t, 60*time.Second, func() bool { return b.countReservations(t, "") == 50 }, "50 orders handled")

		require.Equal(t, 10, b.countReservations(t, warehouse.StatusReserved))
		require.Equal(t, 40, b.countReservations(t, warehouse.StatusRejected))
		require.Zero(t, b.available(t, "HOT-1"))
		require.Equal(t, 10, b.countAnswers(t, warehouse.TypeStockReserved))
		require.Equal(t, 40, b.countAnswers(t, warehouse.TypeStockRejected))
		require.Zero(t, b.deadLettered.Load())
		b.requireConsistent(t)
	})

	t.Run("the same message delivered twice is applied once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumer(t, 4)
		id := uuid.Must(uuid.NewV7())
		m := orderCreated(t, id, warehouse.Line{SKU: "BOOK-1", Quantity: 2}, warehouse.Line{SKU: "MUG-1", Quantity: 1})
		b.publish(t, warehouse.RoutingKeyOrderCreated, m)
		b.publish(t, warehouse.RoutingKeyOrderCreated, m)
		testinfra.Eventually(t, 20*time.Second, func() bool { return b.processed.Load() == 2 }, "both deliveries processed")

		require.Equal(t, int64(1), b.duplicates.Load())
		require.Equal(t, warehouse.StatusReserved, b.reservation(t, id).Status)
		require.Equal(t, int64(98), b.available(t, "BOOK-1"))
		require.Equal(t, int64(49), b.available(t, "MUG-1"))
		var moves int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM stock_movements WHERE order_id = $1 AND sku = 'BOOK-1'`, id).Scan(&moves))
		require.Equal(t, 1, moves, "one ledger entry per line")
		require.Len(t, b.answers(t, id), 1, "one outbox event")
		b.requireConsistent(t)

		t.Run("and another OrderCreated for that order is acknowledged without effect", func(t *testing.T) {
			again := orderCreated(t, id, warehouse.Line{SKU: "BOOK-1", Quantity: 50})
			b.publish(t, warehouse.RoutingKeyOrderCreated, again)
			testinfra.Eventually(t, 20*time.Second, func() bool { return b.processed.Load() == 3 }, "third message processed")
			require.Equal(t, int64(1), b.duplicates.Load(), "a new message id: not a duplicate for the inbox")
			require.Zero(t, b.deadLettered.Load())
			require.Equal(t, int64(98), b.available(t, "BOOK-1"))
			require.Len(t, b.answers(t, id), 1)
			b.requireConsistent(t)
		})
	})

	t.Run("cancel after reserve gives the stock back and answers StockReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumer(t, 4)
		id := uuid.Must(uuid.NewV7())
		created := orderCreated(t, id, warehouse.Line{SKU: "TEE-1", Quantity: 30})
		created.CorrelationID = "req-123"
		created.Headers = amqp091.Table{"correlation_id": "req-123", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
		b.publish(t, warehouse.RoutingKeyOrderCreated, created)
		b.waitStatus(t, id, warehouse.StatusReserved)
		require.Zero(t, b.available(t, "TEE-1"))

		cancelled := orderCancelled(t, id)
		cancelled.CorrelationID = "req-456"
		b.publish(t, warehouse.RoutingKeyOrderCancelled, cancelled)
		b.waitStatus(t, id, warehouse.StatusReleased)
		require.Equal(t, int64(30), b.available(t, "TEE-1"))

		answers := b.answers(t, id)
		require.Len(t, answers, 2)
		reserved, released := answers[0], answers[1]
		require.Equal(t, warehouse.TypeStockReserved, reserved.Type)
		require.Equal(t, warehouse.RoutingKeyStockReserved, reserved.RoutingKey)
		require.Equal(t, b.top.Exchange, reserved.Exchange)
		require.Equal(t, "order", reserved.AggregateType)
		require.Equal(t, id.String(), reserved.AggregateID)
		require.Equal(t, map[string]string{
			"correlation_id": "req-123",
			"causation_id":   created.ID,
			"traceparent":    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		}, reserved.Headers)
		require.EqualValues(t, 1, reserved.Payload["version"])
		require.Equal(t, []any{map[string]any{"sku": "TEE-1", "quantity": float64(30)}}, reserved.Payload["items"])

		require.Equal(t, warehouse.TypeStockReleased, released.Type)
		require.Equal(t, warehouse.RoutingKeyStockReleased, released.RoutingKey)
		require.Equal(t, map[string]string{"correlation_id": "req-456", "causation_id": cancelled.ID}, released.Headers)
		require.Equal(t, []any{map[string]any{"sku": "TEE-1", "quantity": float64(30)}}, released.Payload["items"])
		b.requireConsistent(t)

		t.Run("and a second cancellation changes nothing and answers nothing", func(t *testing.T) {
			b.publish(t, warehouse.RoutingKeyOrderCancelled, orderCancelled(t, id))
			testinfra.Eventually(t, 20*time.Second, func() bool { return b.processed.Load() == 3 }, "third message processed")
			require.Len(t, b.answers(t, id), 2)
			require.Equal(t, int64(30), b.available(t, "TEE-1"))
			b.requireConsistent(t)
		})
	})

	t.Run("cancel before create holds nothing, and the late order is rejected as order_cancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumer(t, 4)
		id := uuid.Must(uuid.NewV7())
		b.publish(t, warehouse.RoutingKeyOrderCancelled, orderCancelled(t, id))
		b.waitStatus(t, id, warehouse.StatusCancelled)

		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, id, warehouse.Line{SKU: "PEN-1", Quantity: 5}))
		testinfra.Eventually(t, 20*time.Second, func() bool { return len(b.answers(t, id)) == 2 }, "two answers")

		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusCancelled, r.Status)
		require.False(t, r.Status.Holds())
		require.Equal(t, int64(200), b.available(t, "PEN-1"))
		answers := b.answers(t, id)
		require.Equal(t, warehouse.TypeStockReleased, answers[0].Type)
		require.Equal(t, []any{}, answers[0].Payload["items"])
		require.Equal(t, warehouse.TypeStockRejected, answers[1].Type)
		require.Equal(t, warehouse.ReasonOrderCancelled, answers[1].Payload["reason"])
		b.requireConsistent(t)
	})

	t.Run("a rejected order's cancellation is answered with an empty StockReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumer(t, 4)
		id := uuid.Must(uuid.NewV7())
		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, id, warehouse.Line{SKU: "NOPE-1", Quantity: 1}))
		b.waitStatus(t, id, warehouse.StatusRejected)
		b.publish(t, warehouse.RoutingKeyOrderCancelled, orderCancelled(t, id))
		testinfra.Eventually(t, 20*time.Second, func() bool { return len(b.answers(t, id)) == 2 }, "two answers")
		answers := b.answers(t, id)
		require.Equal(t, warehouse.TypeStockRejected, answers[0].Type)
		require.Equal(t, warehouse.ReasonUnknownSKU, answers[0].Payload["reason"])
		require.Equal(t, []any{map[string]any{"sku": "NOPE-1", "requested": float64(1), "available": float64(0)}}, answers[0].Payload["shortages"])
		require.Equal(t, warehouse.TypeStockReleased, answers[1].Type)
		require.Equal(t, []any{}, answers[1].Payload["items"])
	})

	for _, tc := range []struct {
		name   string
		msg    func(t *testing.T) message
		key    string
		reason string
		// code is the dead-letter reason's code: permanent-error (the handler's verdict)
		// unless the consumer refused the message before the handler saw it.
		code string
	}{
		{
			name: "an unsupported version",
			msg: func(t *testing.T) message {
				m := orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 1})
				m.Body = []byte(strings.Replace(string(m.Body), `"version":1`, `"version":3`, 1))
				return m
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: "unsupported OrderCreated version 3 (this warehouse reads versions 1 and 2)",
		},
		{
			name: "an unknown type",
			msg: func(t *testing.T) message {
				m := orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 1})
				m.Type = "OrderShipped"
				return m
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: `unknown event type "OrderShipped"`,
		},
		{
			name: "an OrderCancelled without an order id",
			msg: func(t *testing.T) message {
				return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCancelled, Body: []byte(`{"version":1}`)}
			},
			key:    warehouse.RoutingKeyOrderCancelled,
			reason: "no order_id",
		},
		{
			name: "an order with a zero quantity",
			msg: func(t *testing.T) message {
				return orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 0})
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: "quantity must be",
		},
		{
			name: "an order with NUL in a SKU",
			msg: func(t *testing.T) message {
				return orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1\x00", Quantity: 1})
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: "NUL",
		},
		{
			name: "an order with a bidi override in a SKU",
			msg: func(t *testing.T) message {
				return orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "\u202eBOOK-1", Quantity: 1})
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: "bidirectional",
		},
		{
			name: "a body with a duplicate member",
			msg: func(t *testing.T) message {
				id := uuid.Must(uuid.NewV7())
				return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCancelled,
					Body: []byte(`{"version":1,"order_id":"` + id.String() + `","order_id":"` + uuid.NewString() + `"}`)}
			},
			key:    warehouse.RoutingKeyOrderCancelled,
			reason: "more than once",
		},
		{
			name: "a body that is not UTF-8",
			msg: func(t *testing.T) message {
				m := orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 1})
				m.Body = []byte(strings.Replace(string(m.Body), "BOOK-1", "BOOK-\xff", 1))
				return m
			},
			key:    warehouse.RoutingKeyOrderCreated,
			reason: "UTF-8",
			code:   inboxrabbitmq.ReasonMalformedJSON, // the consumer checks the body before the handler
		},
		{
			name: "an order id in upper case",
			msg: func(t *testing.T) message {
				return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCancelled,
					Body: []byte(`{"version":1,"order_id":"` + strings.ToUpper(uuid.NewString()) + `"}`)}
			},
			key:    warehouse.RoutingKeyOrderCancelled,
			reason: "lowercase UUID",
		},
	} {
		t.Run(fmt.Sprintf("%s is dead-lettered at once with the reason", tc.name), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.startConsumer(t, 2)
			m := tc.msg(t)
			b.publish(t, tc.key, m)
			d := b.deadLetter(t)
			require.Equal(t, m.ID, d.MessageId)
			reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
			require.True(t, strings.HasPrefix(reason, cmp.Or(tc.code, inboxrabbitmq.ReasonPermanent)+":"), reason)
			require.Contains(t, reason, tc.reason)
			require.Equal(t, 0, b.countReservations(t, ""))
			require.Equal(t, 0, b.countAnswers(t, warehouse.TypeStockReserved))
			require.Equal(t, int64(100), b.available(t, "BOOK-1"))
		})
	}
}

// TestOrderCreatedVersions runs the consumer on both versions of OrderCreated: each is
// reserved as the other would be, and a warehouse that reads only version 1 (an old release,
// or an operator's WAREHOUSE_ORDER_CREATED_VERSIONS) dead-letters a v2 with a reason that
// says so, applying nothing.
func TestOrderCreatedVersions(t *testing.T) {
	t.Parallel()

	t.Run("v1 and v2 are reserved alike", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumer(t, 2)
		v1, v2 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
		lines := []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 1}}
		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, v1, lines...))
		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreatedV2(t, v2, lines...))
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.countReservations(t, warehouse.StatusReserved) == 2 }, "both reserved")
		for _, id := range []uuid.UUID{v1, v2} {
			answers := b.answers(t, id)
			require.Len(t, answers, 1)
			require.Equal(t, warehouse.TypeStockReserved, answers[0].Type)
			require.Equal(t, []any{map[string]any{"sku": "BOOK-1", "quantity": float64(2)}, map[string]any{"sku": "MUG-1", "quantity": float64(1)}},
				answers[0].Payload["items"])
		}
		require.Equal(t, int64(96), b.available(t, "BOOK-1"))
		require.Zero(t, b.deadLettered.Load())
	})

	t.Run("a warehouse that reads only v1 dead-letters v2 and applies nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startConsumerOf(t, 2, warehouseamqp.HandlerConfig{OrderCreatedVersions: []int{warehouse.OrderCreatedV1}})
		m := orderCreatedV2(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 1})
		b.publish(t, warehouse.RoutingKeyOrderCreated, m)
		d := b.deadLetter(t)
		require.Equal(t, m.ID, d.MessageId)
		reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.Equal(t, inboxrabbitmq.ReasonPermanent+": invalid: unsupported OrderCreated version 2 (this warehouse reads version 1)", reason)
		require.Zero(t, b.countReservations(t, ""))
		require.Equal(t, int64(100), b.available(t, "BOOK-1"))
		// A v1 still goes through.
		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BOOK-1", Quantity: 1}))
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.countReservations(t, warehouse.StatusReserved) == 1 }, "the v1 reserved")
	})
}

func TestTopology(t *testing.T) {
	t.Parallel()

	t.Run("declaring twice is harmless and the queues are quorum queues", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.top.Declare(b.ch))
		// A passive declare with other arguments would fail; a declare with the same ones
		// succeeds only when they match.
		q, err := b.ch.QueueDeclare(b.top.Queue, true, false, false, false, amqp091.Table{
			amqp091.QueueTypeArg:        amqp091.QueueTypeQuorum,
			"x-delivery-limit":          int64(20),
			"x-dead-letter-exchange":    b.top.DeadLetterExchange,
			"x-dead-letter-routing-key": b.top.Queue,
		})
		require.NoError(t, err)
		require.Zero(t, q.Messages)
	})

	// The dead-letter queue keeps what it holds: peeked 25 times with a requeue (what the
	// management UI's "get messages" does), a dead letter is still there. With the delivery
	// limit of 20 it used to have, the broker dropped it at the 21st.
	t.Run("the dead-letter queue keeps a message peeked 25 times", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conf, err := b.ch.PublishWithDeferredConfirmWithContext(context.Background(), b.top.DeadLetterExchange, b.top.Queue, true, false,
			amqp091.Publishing{MessageId: "dead-1", DeliveryMode: amqp091.Persistent, Body: []byte(`{}`)})
		require.NoError(t, err)
		require.True(t, conf.Wait())
		for i := range 25 {
			var d amqp091.Delivery
			testinfra.Eventually(t, 10*time.Second, func() bool {
				var ok bool
				d, ok, err = b.ch.Get(b.top.DeadLetterQueue, false)
				require.NoError(t, err)
				return ok
			}, "the dead letter is gone after %d peeks", i)
			require.Equal(t, "dead-1", d.MessageId)
			require.NoError(t, d.Nack(false, true))
		}
		testinfra.Eventually(t, 10*time.Second, func() bool {
			q, err := b.ch.QueueDeclarePassive(b.top.DeadLetterQueue, true, false, false, false, nil)
			require.NoError(t, err)
			return q.Messages == 1
		}, "the dead letter is still in %s", b.top.DeadLetterQueue)
	})

	// A warehouse whose delivery limit changed finds its queue as it was declared: it keeps
	// it and consumes, rather than failing every connection with PRECONDITION_FAILED.
	t.Run("a changed delivery limit does not stop the consumer", func(t *testing.T) {
		t.Parallel()
		b := setup(t) // declared with DeliveryLimit 20
		b.top.DeliveryLimit = 4
		b.startConsumer(t, 2)
		order := uuid.Must(uuid.NewV7())
		b.publish(t, warehouse.RoutingKeyOrderCreated, orderCreated(t, order, warehouse.Line{SKU: "BOOK-1", Quantity: 1}))
		testinfra.Eventually(t, 20*time.Second, func() bool { return b.processed.Load() == 1 }, "the message processed")
		require.Equal(t, warehouse.StatusReserved, b.reservation(t, order).Status)
	})

	t.Run("defaults follow docs/events.md", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, warehouseamqp.Topology{
			Exchange: "shop.events", DeadLetterExchange: "shop.dlx", Queue: "warehouse.orders",
			DeadLetterQueue: "warehouse.orders.dead", DeliveryLimit: 20,
		}, warehouseamqp.DefaultTopology())
		require.NoError(t, warehouseamqp.DefaultTopology().Validate())
		require.Error(t, warehouseamqp.Topology{}.Validate())
	})
}

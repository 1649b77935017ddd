package amqp_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxshop/outboxshop/internal/telemetry"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// bundle is what a test works with: a migrated database and a topology of its own, a
// confirming channel to publish on, and counters fed by the consumer's hooks.
type bundle struct {
	pool                                *pgxpool.Pool
	store                               *postgres.Store
	amqpURL                             string
	top                                 warehouseamqp.Topology
	ch                                  *amqp091.Channel
	processed, duplicates, deadLettered atomic.Int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(ctx, pool))
	b := &bundle{
		pool:    pool,
		amqpURL: testinfra.AMQPURL(t),
		top: warehouseamqp.Topology{
			Exchange:           testinfra.UniqueName(t, "ex"),
			DeadLetterExchange: testinfra.UniqueName(t, "dlx"),
			Queue:              testinfra.UniqueName(t, "q"),
			DeadLetterQueue:    testinfra.UniqueName(t, "dlq"),
			DeliveryLimit:      20,
		},
	}
	// The store records the trace context of the consumer's process span in the answers, as
	// the app's does.
	var err error
	b.store, err = postgres.NewStore(pool, postgres.StoreConfig{Exchange: b.top.Exchange, Propagator: telemetry.Propagator()})
	require.NoError(t, err)
	conn, err := amqp091.Dial(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.top.Declare(b.ch))
	require.NoError(t, b.ch.Confirm(false))
	t.Cleanup(func() { deleteTopology(t, b.amqpURL, b.top) })
	return b
}

// deleteTopology removes a test's queues and exchanges, on a connection of its own.
func deleteTopology(t *testing.T, amqpURL string, top warehouseamqp.Topology) {
	conn, err := amqp091.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{top.Queue, top.DeadLetterQueue} {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	for _, ex := range []string{top.Exchange, top.DeadLetterExchange} {
		require.NoError(t, ch.ExchangeDelete(ex, false, false))
	}
}

// startConsumer runs the warehouse consumer until the test ends.
func (b *bundle) startConsumer(t *testing.T, concurrency int) {
	t.Helper()
	b.startConsumerOf(t, concurrency, warehouseamqp.HandlerConfig{})
}

// startConsumerOf is startConsumer with a handler configuration of the test's.
func (b *bundle) startConsumerOf(t *testing.T, concurrency int, hc warehouseamqp.HandlerConfig) {
	t.Helper()
	hc.Logger = testLogger(t)
	c, err := inboxrabbitmq.NewConsumer(b.pool, inboxrabbitmq.Config{
		URLs:                 []string{b.amqpURL},
		Queue:                b.top.Queue,
		Name:                 warehouseamqp.ConsumerName,
		Handler:              warehouseamqp.NewHandler(b.store, hc),
		DeadLetterExchange:   b.top.DeadLetterExchange,
		DeadLetterRoutingKey: b.top.Queue,
		Setup:                b.top.Declare,
		Prefetch:             max(concurrency, 16),
		Concurrency:          concurrency,
		MaxDeliveries:        3,
		RetryBaseDelay:       50 * time.Millisecond,
		ShutdownTimeout:      5 * time.Second,
		Logger:               testLogger(t),
		// Tracing off, as the service runs without an OTLP endpoint: no spans, but a
		// delivery's trace context still reaches its answers.
		TracerProvider: noop.NewTracerProvider(),
		Propagator:     telemetry.Propagator(),
		Hooks: inboxrabbitmq.Hooks{
			Processed: func(p inboxrabbitmq.ProcessedMessage) {
				b.processed.Add(1)
				if p.Duplicate {
					b.duplicates.Add(1)
				}
			},
			DeadLettered: func(inboxrabbitmq.DeadLetter) { b.deadLettered.Add(1) },
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// message is an event as the orders service's relay publishes it.
type message struct {
	ID, Type, CorrelationID string
	Headers                 amqp091.Table
	Body                    []byte
}

func (b *bundle) publish(t *testing.T, routingKey string, m message) {
	t.Helper()
	conf, err := b.ch.PublishWithDeferredConfirmWithContext(context.Background(), b.top.Exchange, routingKey, true, false, amqp091.Publishing{
		MessageId:     m.ID,
		Type:          m.Type,
		CorrelationId: m.CorrelationID,
		Headers:       m.Headers,
		ContentType:   "application/json",
		DeliveryMode:  amqp091.Persistent,
		Timestamp:     time.Now(),
		Body:          m.Body,
	})
	require.NoError(t, err)
	ok, err := conf.WaitContext(context.Background())
	require.NoError(t, err)
	require.True(t, ok, "broker nacked the message")
}

func orderCreated(t *testing.T, id uuid.UUID, lines ...warehouse.Line) message {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"version": 1, "order_id": id, "customer_id": "c-42", "items": lines, "created_at": time.Now().UTC(),
	})
	require.NoError(t, err)
	return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCreated, Body: body}
}

// orderCreatedV2 is orderCreated in version 2 of the event (docs/events.md).
func orderCreatedV2(t *testing.T, id uuid.UUID, lines ...warehouse.Line) message {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"version": 2, "order_id": id, "customer": map[string]string{"id": "c-42"}, "lines": lines, "created_at": time.Now().UTC(),
	})
	require.NoError(t, err)
	return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCreated, Body: body}
}

func orderCancelled(t *testing.T, id uuid.UUID) message {
	t.Helper()
	body, err := json.Marshal(map[string]any{"version": 1, "order_id": id, "cancelled_at": time.Now().UTC()})
	require.NoError(t, err)
	return message{ID: uuid.Must(uuid.NewV7()).String(), Type: warehouse.TypeOrderCancelled, Body: body}
}

// answer is an outbox row the handler wrote.
type answer struct {
	Type, RoutingKey, Exchange, AggregateType, AggregateID string
	Headers                                                map[string]string
	Payload                                                map[string]any
}

// answers returns the outbox rows of an order, oldest first.
func (b *bundle) answers(t *testing.T, orderID uuid.UUID) []answer {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT type, routing_key, exchange, aggregate_type, aggregate_id, headers, payload
FROM outbox_messages WHERE aggregate_id = $1 ORDER BY seq`, orderID.String())
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[answer])
	require.NoError(t, err)
	return out
}

func (b *bundle) countAnswers(t *testing.T, typ string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE type = $1`, typ).Scan(&n))
	return n
}

func (b *bundle) countReservations(t *testing.T, status warehouse.Status) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reservations WHERE status = $1 OR $1 = ''`, string(status)).Scan(&n))
	return n
}

// reservation returns the order's reservation, or nil when there is none yet.
func (b *bundle) reservation(t *testing.T, id uuid.UUID) *warehouse.Reservation {
	t.Helper()
	r, err := b.store.GetReservation(context.Background(), id)
	if warehouse.ErrorCode(err) == warehouse.CodeNotFound {
		return nil
	}
	require.NoError(t, err)
	return &r
}

func (b *bundle) waitStatus(t *testing.T, id uuid.UUID, status warehouse.Status) *warehouse.Reservation {
	t.Helper()
	var r *warehouse.Reservation
	testinfra.Eventually(t, 20*time.Second, func() bool {
		r = b.reservation(t, id)
		return r != nil && r.Status == status
	}, "reservation of %s is %s", id, status)
	return r
}

func (b *bundle) available(t *testing.T, sku string) int64 {
	t.Helper()
	item, err := b.store.GetStock(context.Background(), sku)
	require.NoError(t, err)
	return item.Available
}

func (b *bundle) requireConsistent(t *testing.T) {
	t.Helper()
	problems, err := postgres.Verify(context.Background(), b.pool)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// deadLetter waits for the next message in the dead-letter queue.
func (b *bundle) deadLetter(t *testing.T) amqp091.Delivery {
	t.Helper()
	var d amqp091.Delivery
	testinfra.Eventually(t, 20*time.Second, func() bool {
		var ok bool
		var err error
		d, ok, err = b.ch.Get(b.top.DeadLetterQueue, true)
		require.NoError(t, err)
		return ok
	}, "a message in the dead-letter queue %s", b.top.DeadLetterQueue)
	return d
}

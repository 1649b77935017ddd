package amqp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/services/orders"
	ordersamqp "github.com/outboxshop/outboxshop/services/orders/amqp"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// bundle is a consumer test's world: a migrated database, a topology of its own, the stock
// consumer running on it, and a confirming channel to publish with.
type bundle struct {
	pool  *pgxpool.Pool
	store *postgres.Store
	top   ordersamqp.Topology
	ch    *amqp.Channel
	logs  *logBuffer

	mu        sync.Mutex
	processed []string // message types, with " duplicate" appended for duplicates
	dead      []string // reasons
}

func uniqueTopology(t *testing.T) ordersamqp.Topology {
	return ordersamqp.Topology{
		Exchange:           testinfra.UniqueName(t, "ex"),
		DeadLetterExchange: testinfra.UniqueName(t, "dlx"),
		Queue:              testinfra.UniqueName(t, "q"),
		DeadLetterQueue:    testinfra.UniqueName(t, "dq"),
	}
}

// deleteTopology removes top from the broker when the test ends (after the consumer stopped:
// cleanups run last-registered first).
func deleteTopology(t *testing.T, amqpURL string, top ordersamqp.Topology) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(amqpURL)
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
	})
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(ctx, pool))
	amqpURL := testinfra.AMQPURL(t)
	b := &bundle{pool: pool, top: uniqueTopology(t).WithDefaults(), logs: &logBuffer{}}
	var err error
	b.store, err = postgres.NewStore(pool, postgres.StoreConfig{Exchange: b.top.Exchange})
	require.NoError(t, err)
	deleteTopology(t, amqpURL, b.top)

	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                  amqpURL,
		Queue:                b.top.Queue,
		Name:                 ordersamqp.ConsumerName,
		Handler:              ordersamqp.NewHandler(b.store, slog.New(slog.NewJSONHandler(b.logs, nil))),
		Prefetch:             8,
		RetryBaseDelay:       10 * time.Millisecond,
		ShutdownTimeout:      10 * time.Second,
		DeadLetterExchange:   b.top.DeadLetterExchange,
		DeadLetterRoutingKey: b.top.Queue,
		Setup:                b.top.Declare,
		Hooks: inboxrabbitmq.Hooks{
			Processed: func(p inboxrabbitmq.ProcessedMessage) {
				b.mu.Lock()
				defer b.mu.Unlock()
				msgType := p.Type
				if p.Duplicate {
					msgType += " duplicate"
				}
				b.processed = append(b.processed, msgType)
			},
			DeadLettered: func(d inboxrabbitmq.DeadLetter) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.dead = append(b.dead, d.Reason)
			},
		},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.ch.Confirm(false))
	// Wait for the consumer to declare the topology (its Setup) before publishing into it.
	testinfra.Eventually(t, 10*time.Second, func() bool {
		probe, err := conn.Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		q, err := probe.QueueDeclarePassive(b.top.Queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		return err == nil && q.Consumers == 1
	}, "consumer on %s", b.top.Queue)
	return b
}

// publish sends a stock event to the events exchange and waits for the broker's confirm.
func (b *bundle) publish(t *testing.T, msgID, typ, routingKey, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, b.top.Exchange, routingKey, true, false, amqp.Publishing{
		MessageId: msgID, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		CorrelationId: "corr-" + msgID, Timestamp: time.Now(), Body: []byte(body),
	})
	require.NoError(t, err)
	ok, err := conf.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok, "broker nacked")
}

// stock publishes a version-1 stock event for id.
func (b *bundle) stock(t *testing.T, msgID, typ string, id uuid.UUID) {
	t.Helper()
	keys := map[string]string{
		orders.EventStockReserved: "stock.reserved", orders.EventStockRejected: "stock.rejected", orders.EventStockReleased: "stock.released",
	}
	body := map[string]string{
		orders.EventStockReserved: fmt.Sprintf(`{"version":1,"order_id":%q,"items":[{"sku":"BOOK-1","quantity":2}],"reserved_at":"2026-11-29T10:00:00Z"}`, id),
		orders.EventStockRejected: fmt.Sprintf(`{"version":1,"order_id":%q,"reason":"insufficient_stock","shortages":[{"sku":"BOOK-1","requested":2,"available":1}],"rejected_at":"2026-11-29T10:00:00Z"}`, id),
		orders.EventStockReleased: fmt.Sprintf(`{"version":1,"order_id":%q,"items":[],"released_at":"2026-11-29T10:00:00Z","extra_field":"ignored"}`, id),
	}
	b.publish(t, msgID, typ, keys[typ], body[typ])
}

func (b *bundle) processedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.processed)
}

// waitProcessed waits until n messages were processed (committed or found duplicate) and
// acknowledged.
func (b *bundle) waitProcessed(t *testing.T, n int) {
	t.Helper()
	testinfra.Eventually(t, 15*time.Second, func() bool { return b.processedCount() >= n }, "%d messages processed", n)
}

func (b *bundle) createOrder(t *testing.T) *orders.Order {
	t.Helper()
	res, err := b.store.CreateOrder(context.Background(), orders.CreateOrderInput{
		Request: orders.OrderRequest{CustomerID: "c-1", Items: []orders.Item{{SKU: "BOOK-1", Quantity: 2}}},
		Meta:    orders.EventMeta{CorrelationID: "req-1"},
	})
	require.NoError(t, err)
	return res.Order
}

func (b *bundle) order(t *testing.T, id uuid.UUID) *orders.Order {
	t.Helper()
	o, err := b.store.Order(context.Background(), id)
	require.NoError(t, err)
	return o
}

func TestConsumer(t *testing.T) {
	t.Parallel()

	t.Run("Reserved", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		b.stock(t, "m-reserved", orders.EventStockReserved, o.ID)
		b.waitProcessed(t, 1)
		got := b.order(t, o.ID)
		require.Equal(t, orders.StatusReserved, got.Status)
		require.Len(t, got.History, 2)
		require.Equal(t, orders.StatusChange{From: orders.StatusPending, To: orders.StatusReserved, Event: "StockReserved",
			MessageID: "m-reserved", At: got.History[1].At}, got.History[1])
		line := b.logs.lines(t, "order status changed")
		require.Len(t, line, 1)
		require.Equal(t, o.ID.String(), line[0]["order_id"])
		require.Equal(t, "m-reserved", line[0]["message_id"])
	})

	t.Run("Rejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		b.stock(t, "m-rejected", orders.EventStockRejected, o.ID)
		b.waitProcessed(t, 1)
		got := b.order(t, o.ID)
		require.Equal(t, orders.StatusRejected, got.Status)
		require.Equal(t, "insufficient_stock", got.History[1].Reason)
	})

	t.Run("Released", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		b.stock(t, "m-reserved", orders.EventStockReserved, o.ID)
		b.waitProcessed(t, 1)
		_, err := b.store.CancelOrder(context.Background(), o.ID, orders.EventMeta{CorrelationID: "req-2"})
		require.NoError(t, err)
		b.stock(t, "m-released", orders.EventStockReleased, o.ID)
		b.waitProcessed(t, 2)
		got := b.order(t, o.ID)
		require.Equal(t, orders.StatusCancelled, got.Status)
		var steps []string
		for _, h := range got.History {
			steps = append(steps, fmt.Sprintf("%s>%s:%s", h.From, h.To, h.Event))
		}
		require.Equal(t, []string{">PENDING:OrderCreated", "PENDING>RESERVED:StockReserved",
			"RESERVED>CANCELLING:OrderCancelled", "CANCELLING>CANCELLED:StockReleased"}, steps)
	})

	t.Run("IllegalTransition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		_, err := b.store.CancelOrder(context.Background(), o.ID, orders.EventMeta{})
		require.NoError(t, err)
		// The warehouse reserved before it saw the cancellation: logged and acknowledged.
		b.stock(t, "m-late-reserved", orders.EventStockReserved, o.ID)
		// A release for an order that is not cancelling.
		o2 := b.createOrder(t)
		b.stock(t, "m-early-release", orders.EventStockReleased, o2.ID)
		b.waitProcessed(t, 2)

		require.Equal(t, orders.StatusCancelling, b.order(t, o.ID).Status)
		require.Len(t, b.order(t, o.ID).History, 2)
		require.Equal(t, orders.StatusPending, b.order(t, o2.ID).Status)
		require.Len(t, b.order(t, o2.ID).History, 1)
		b.mu.Lock()
		require.Empty(t, b.dead, "an illegal transition is not dead-lettered")
		require.ElementsMatch(t, []string{"StockReserved", "StockReleased"}, b.processed, "acknowledged as processed")
		b.mu.Unlock()

		lines := b.logs.lines(t, "illegal transition: acknowledged, nothing changed")
		require.Len(t, lines, 2)
		byMsg := map[string]map[string]any{}
		for _, l := range lines {
			byMsg[l["message_id"].(string)] = l
		}
		require.Equal(t, o.ID.String(), byMsg["m-late-reserved"]["order_id"])
		require.Equal(t, "CANCELLING", byMsg["m-late-reserved"]["from"])
		require.Equal(t, "StockReserved", byMsg["m-late-reserved"]["event"])
		require.Equal(t, o2.ID.String(), byMsg["m-early-release"]["order_id"])
		require.Equal(t, "PENDING", byMsg["m-early-release"]["from"])
		require.Equal(t, "StockReleased", byMsg["m-early-release"]["event"])
	})

	t.Run("UnknownOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := uuid.Must(uuid.NewV7())
		b.stock(t, "m-unknown", orders.EventStockReserved, id)
		b.waitProcessed(t, 1)
		lines := b.logs.lines(t, "stock event for an unknown order: acknowledged, nothing changed")
		require.Len(t, lines, 1)
		require.Equal(t, id.String(), lines[0]["order_id"])
		require.Equal(t, "m-unknown", lines[0]["message_id"])
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM order_status_history`).Scan(&n))
		require.Zero(t, n)
	})

	t.Run("DuplicateMessageID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		b.stock(t, "m-twice", orders.EventStockReserved, o.ID)
		b.stock(t, "m-twice", orders.EventStockReserved, o.ID)
		b.waitProcessed(t, 2)
		got := b.order(t, o.ID)
		require.Equal(t, orders.StatusReserved, got.Status)
		require.Len(t, got.History, 2, "one history row for the message, however often it arrives")
		b.mu.Lock()
		require.ElementsMatch(t, []string{"StockReserved", "StockReserved duplicate"}, b.processed)
		b.mu.Unlock()
		// Not even logged as an illegal transition: the second copy never reached the handler.
		require.Empty(t, b.logs.lines(t, "illegal transition: acknowledged, nothing changed"))
	})

	t.Run("DeadLetters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o := b.createOrder(t)
		bad := []struct{ id, typ, key, body, reason string }{
			{"m-type", "StockCounted", "stock.reserved", fmt.Sprintf(`{"version":1,"order_id":%q}`, o.ID), "unknown event type"},
			{"m-version", "StockReserved", "stock.reserved", fmt.Sprintf(`{"version":2,"order_id":%q}`, o.ID), "unsupported version 2"},
			{"m-noversion", "StockReserved", "stock.reserved", fmt.Sprintf(`{"order_id":%q}`, o.ID), "unsupported version 0"},
			{"m-orderid", "StockRejected", "stock.rejected", `{"version":1,"order_id":"nope"}`, "order_id"},
			{"m-shape", "StockReleased", "stock.released", `{"version":"1"}`, "decode"},
			{"m-json", "StockReserved", "stock.reserved", `{"version":`, "malformed-json"},
			// The input policy holds for events too (internal/input).
			{"m-dupkey", "StockReserved", "stock.reserved", fmt.Sprintf(`{"version":1,"order_id":%q,"order_id":%q}`, o.ID, o.ID), "more than once"},
			{"m-case", "StockReserved", "stock.reserved", fmt.Sprintf(`{"version":1,"ORDER_ID":%q}`, o.ID), "case-sensitive"},
			{"m-utf8", "StockRejected", "stock.rejected", fmt.Sprintf("{\"version\":1,\"order_id\":%q,\"reason\":\"x\xff\"}", o.ID), "UTF-8"},
			{"m-nul", "StockRejected", "stock.rejected", fmt.Sprintf(`{"version":1,"order_id":%q,"reason":"x\u0000"}`, o.ID), "NUL"},
			{"m-bidi", "StockRejected", "stock.rejected", fmt.Sprintf(`{"version":1,"order_id":%q,"reason":"x\u202e"}`, o.ID), "bidirectional"},
			{"m-upper", "StockReserved", "stock.reserved", fmt.Sprintf(`{"version":1,"order_id":%q}`, strings.ToUpper(o.ID.String())), "lowercase UUID"},
		}
		for _, m := range bad {
			b.publish(t, m.id, m.typ, m.key, m.body)
		}
		testinfra.Eventually(t, 15*time.Second, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.dead) == len(bad)
		}, "%d dead letters", len(bad))

		reasons := map[string]string{}
		testinfra.Eventually(t, 10*time.Second, func() bool {
			d, ok, err := b.ch.Get(b.top.DeadLetterQueue, true)
			require.NoError(t, err)
			if ok {
				reasons[d.MessageId], _ = d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
			}
			return len(reasons) == len(bad)
		}, "dead letters in %s", b.top.DeadLetterQueue)
		for _, m := range bad {
			require.Contains(t, reasons[m.id], m.reason, m.id)
		}
		got := b.order(t, o.ID)
		require.Equal(t, orders.StatusPending, got.Status, "no dead letter changed the order")
	})
}

func TestTopologyDeclare(t *testing.T) {
	t.Parallel()
	amqpURL := testinfra.AMQPURL(t)
	top := uniqueTopology(t)
	deleteTopology(t, amqpURL, top)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	for range 2 { // idempotent: a restart declares the same again
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, top.Declare(ch))
		require.NoError(t, ch.Close())
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 8))
	// Each stock routing key reaches the queue; a dead letter routed with the queue's name
	// reaches the dead-letter queue.
	for _, key := range ordersamqp.StockRoutingKeys {
		c, err := ch.PublishWithDeferredConfirm(top.Exchange, key, true, false, amqp.Publishing{Body: []byte(`{}`)})
		require.NoError(t, err)
		require.True(t, c.Wait())
	}
	c, err := ch.PublishWithDeferredConfirm(top.DeadLetterExchange, top.Queue, true, false, amqp.Publishing{Body: []byte(`{}`)})
	require.NoError(t, err)
	require.True(t, c.Wait())
	select {
	case r := <-returns:
		t.Fatalf("returned as unroutable: %s %s", r.Exchange, r.RoutingKey)
	default:
	}
	q, err := ch.QueueDeclarePassive(top.Queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, len(ordersamqp.StockRoutingKeys), q.Messages)
	dq, err := ch.QueueDeclarePassive(top.DeadLetterQueue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 1, dq.Messages)
	// The dead-letter queue has no delivery limit (docs/events.md): the broker accepts a
	// declaration of it as a quorum queue without one, which it would refuse otherwise.
	_, err = ch.QueueDeclare(top.DeadLetterQueue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
}

// logBuffer collects JSON log lines safely from concurrent handlers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	data := strings.Clone(l.buf.String())
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

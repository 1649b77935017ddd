package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// PayloadSize is the size of every event body the run writes or publishes: an
// OrderCreated padded to about 1 KiB.
const PayloadSize = 1024

// ordersTable is the orders-like table the writer inserts a row into, in the same
// transaction as the event: the shape of services/orders' orders table, without the lines,
// history and idempotency key that the API adds (item 7 measures those).
const ordersTable = `
CREATE TABLE IF NOT EXISTS orders (
    id          uuid        PRIMARY KEY,
    customer_id text        NOT NULL,
    status      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
)`

const insertOrder = `INSERT INTO orders (id, customer_id, status) VALUES ($1, $2, 'PENDING')`

// skus are the warehouse catalogue's SKUs, which the warehouse consumer reserves.
var skus = []string{"BOOK-1", "MUG-1", "TEE-1", "PEN-1", "BAG-1"}

type orderLine struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// orderCreated is services/orders' OrderCreated (docs/events.md), with a note that pads it
// to PayloadSize. The warehouse ignores fields it does not know.
type orderCreated struct {
	Version    int         `json:"version"`
	OrderID    uuid.UUID   `json:"order_id"`
	CustomerID string      `json:"customer_id"`
	Items      []orderLine `json:"items"`
	CreatedAt  time.Time   `json:"created_at"`
	Note       string      `json:"note"`
}

var padding = strings.Repeat("x", PayloadSize)

// orderEvent returns an order id and its OrderCreated outbox message for exchange, with its
// id set, a body of PayloadSize bytes and a correlation id, as the orders service writes it:
// one line of one of the five [skus], in turn.
func orderEvent(exchange string, n int) (uuid.UUID, outbox.Message) {
	return orderEventOf(exchange, n, skus[n%len(skus)])
}

// orderEventOf is [orderEvent] with its one line on sku.
func orderEventOf(exchange string, n int, sku string) (uuid.UUID, outbox.Message) {
	orderID := uuid.Must(uuid.NewV7())
	ev := orderCreated{
		Version: 1, OrderID: orderID, CustomerID: "customer-" + strconv.Itoa(n%1000),
		Items:     []orderLine{{SKU: sku, Quantity: 1}},
		CreatedAt: time.Now().UTC(),
	}
	body, _ := json.Marshal(ev) // a struct of plain fields always marshals
	if pad := PayloadSize - len(body); pad > 0 {
		ev.Note = padding[:pad]
		body, _ = json.Marshal(ev)
	}
	return orderID, outbox.Message{
		ID:            uuid.Must(uuid.NewV7()),
		Exchange:      exchange,
		RoutingKey:    "order.created",
		Type:          "OrderCreated",
		AggregateType: "order",
		AggregateID:   orderID.String(),
		Payload:       body,
		Headers:       map[string]string{outbox.HeaderCorrelationID: uuid.NewString()},
	}
}

// migrateWriter applies the outbox schema and the orders-like table.
func migrateWriter(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, ordersTable); err != nil {
		return fmt.Errorf("create orders table: %w", err)
	}
	return nil
}

// writeOrder is the business transaction of the benchmark: an orders row and its
// OrderCreated event through outbox.Add, committed. It returns the message id and the time
// right after COMMIT returned.
func writeOrder(ctx context.Context, pool *pgxpool.Pool, exchange string, n int) (string, time.Time, error) {
	orderID, msg := orderEvent(exchange, n)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, insertOrder, orderID, "customer-"+strconv.Itoa(n%1000)); err != nil {
		return "", time.Time{}, fmt.Errorf("insert order: %w", err)
	}
	if err := outbox.Add(ctx, tx, msg); err != nil {
		return "", time.Time{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", time.Time{}, fmt.Errorf("commit: %w", err)
	}
	return msg.ID.String(), time.Now(), nil
}

// fillBacklog writes rows OrderCreated events to the outbox in transactions of 1,000
// through outbox.Add, then analyses the table, as autovacuum would have by the time a
// backlog of that size is drained.
func fillBacklog(ctx context.Context, pool *pgxpool.Pool, exchange string, rows int) error {
	const perTx = 1000
	for done := 0; done < rows; done += perTx {
		msgs := make([]outbox.Message, min(perTx, rows-done))
		for i := range msgs {
			_, msgs[i] = orderEvent(exchange, done+i)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, msgs...) }); err != nil {
			return fmt.Errorf("fill outbox: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_messages"); err != nil {
		return fmt.Errorf("vacuum analyze outbox: %w", err)
	}
	return nil
}

// nullPublisher confirms every message at once: the relay's database work alone.
type nullPublisher struct{}

func (nullPublisher) Publish(_ context.Context, msgs []outbox.Message) []error {
	return make([]error, len(msgs))
}

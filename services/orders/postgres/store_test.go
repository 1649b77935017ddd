package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

const testExchange = "test.events"

type storeBundle struct {
	pool  *pgxpool.Pool
	store *postgres.Store
}

func setup(t *testing.T) *storeBundle {
	t.Helper()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: testExchange, Propagator: propagation.TraceContext{}})
	require.NoError(t, err)
	return &storeBundle{pool: pool, store: store}
}

func (b *storeBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

func (b *storeBundle) setStatus(t *testing.T, id uuid.UUID, s orders.Status) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `UPDATE orders SET status = $2 WHERE id = $1`, id, s)
	require.NoError(t, err)
}

// create creates a valid order without an idempotency key.
func (b *storeBundle) create(t *testing.T) *orders.Order {
	t.Helper()
	res, err := b.store.CreateOrder(context.Background(), orders.CreateOrderInput{
		Request: orders.OrderRequest{CustomerID: "c-1", Items: []orders.Item{{SKU: "BOOK-1", Quantity: 2}}},
		Meta:    orders.EventMeta{CorrelationID: "req-create"},
	})
	require.NoError(t, err)
	return res.Order
}

type outboxRow struct {
	ID            uuid.UUID
	Exchange      string
	RoutingKey    string
	Type          string
	AggregateType string
	AggregateID   string
	Payload       map[string]any
	Headers       map[string]string
}

func (b *storeBundle) outbox(t *testing.T) []outboxRow {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers FROM outbox_messages ORDER BY seq`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	require.NoError(t, err)
	return out
}

func render(o *orders.Order) (orders.Response, error) {
	b, err := json.Marshal(map[string]any{"id": o.ID, "status": o.Status})
	return orders.Response{Status: 201, Body: b}, err
}

func TestStoreCreateOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("WritesOrderHistoryAndEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The caller's span context, recorded by outbox.Add through the store's propagator.
		tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		sctx := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
		res, err := b.store.CreateOrder(sctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c-42", Items: []orders.Item{{SKU: "MUG-1", Quantity: 3}, {SKU: "BOOK-1", Quantity: 1}}},
			Meta:    orders.EventMeta{CorrelationID: "req-1"},
		})
		require.NoError(t, err)
		require.False(t, res.Replayed)
		o := res.Order
		require.Equal(t, res.OrderID, o.ID)
		require.Equal(t, uuid.Version(7), o.ID.Version())
		require.Equal(t, orders.StatusPending, o.Status)
		require.Equal(t, []orders.Line{{SKU: "MUG-1", Name: "Outbox mug", Quantity: 3}, {SKU: "BOOK-1", Name: "The Go Programming Language", Quantity: 1}}, o.Lines)
		require.Len(t, o.History, 1)
		require.Equal(t, orders.StatusChange{To: orders.StatusPending, Event: orders.EventOrderCreated, At: o.CreatedAt}, o.History[0])

		rows := b.outbox(t)
		require.Len(t, rows, 1)
		r := rows[0]
		require.Equal(t, testExchange, r.Exchange)
		require.Equal(t, "order.created", r.RoutingKey)
		require.Equal(t, "OrderCreated", r.Type)
		require.Equal(t, "order", r.AggregateType)
		require.Equal(t, o.ID.String(), r.AggregateID)
		require.Equal(t, map[string]string{"correlation_id": "req-1", "traceparent": tp}, r.Headers)
		require.Equal(t, float64(1), r.Payload["version"])
		require.Equal(t, o.ID.String(), r.Payload["order_id"])
		require.Equal(t, "c-42", r.Payload["customer_id"])
		require.Equal(t, []any{
			map[string]any{"sku": "MUG-1", "quantity": float64(3)},
			map[string]any{"sku": "BOOK-1", "quantity": float64(1)},
		}, r.Payload["items"])
		createdAt, err := time.Parse(time.RFC3339Nano, r.Payload["created_at"].(string))
		require.NoError(t, err)
		require.True(t, createdAt.Equal(o.CreatedAt))

		got, err := b.store.Order(ctx, o.ID)
		require.NoError(t, err)
		require.Equal(t, o, got)
	})

	t.Run("UnknownSKUWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.CreateOrder(ctx, orders.CreateOrderInput{
			Request:     orders.OrderRequest{CustomerID: "c", Items: []orders.Item{{SKU: "BOOK-1", Quantity: 1}, {SKU: "NOPE-1", Quantity: 1}, {SKU: "book-1", Quantity: 1}}},
			Idempotency: &orders.IdempotencyKey{Key: "k", Fingerprint: []byte{1}},
			Render:      render,
		})
		require.Equal(t, orders.CodeValidation, orders.ErrorCode(err))
		require.Equal(t, []orders.FieldError{
			{Field: "items[1].sku", Message: `"NOPE-1" is not in the catalogue`},
			{Field: "items[2].sku", Message: `"book-1" is not in the catalogue`},
		}, orders.ErrorFields(err))
		for _, table := range []string{"orders", "order_lines", "order_status_history", "outbox_messages", "idempotency_keys"} {
			require.Zero(t, b.count(t, table), table)
		}
	})

	t.Run("IdempotencyKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := orders.CreateOrderInput{
			Request:     orders.OrderRequest{CustomerID: "c", Items: []orders.Item{{SKU: "PEN-1", Quantity: 1}}},
			Idempotency: &orders.IdempotencyKey{Key: "key-1", Fingerprint: []byte("fp-1")},
			Render:      render,
		}
		first, err := b.store.CreateOrder(ctx, in)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		require.NotNil(t, first.Response)

		second, err := b.store.CreateOrder(ctx, in)
		require.NoError(t, err)
		require.True(t, second.Replayed)
		require.Nil(t, second.Order)
		require.Equal(t, first.OrderID, second.OrderID)
		require.Equal(t, first.Response, second.Response)

		in.Idempotency = &orders.IdempotencyKey{Key: "key-1", Fingerprint: []byte("fp-2")}
		_, err = b.store.CreateOrder(ctx, in)
		require.Equal(t, orders.CodeIdempotencyReuse, orders.ErrorCode(err))

		require.Equal(t, 1, b.count(t, "orders"))
		require.Equal(t, 1, b.count(t, "outbox_messages"))
		require.Equal(t, 1, b.count(t, "idempotency_keys"))
	})

	t.Run("RefusedRequestDoesNotKeepTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := &orders.IdempotencyKey{Key: "key-2", Fingerprint: []byte("fp")}
		_, err := b.store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c", Items: []orders.Item{{SKU: "NOPE", Quantity: 1}}}, Idempotency: key, Render: render,
		})
		require.Equal(t, orders.CodeValidation, orders.ErrorCode(err))
		res, err := b.store.CreateOrder(ctx, orders.CreateOrderInput{
			Request: orders.OrderRequest{CustomerID: "c", Items: []orders.Item{{SKU: "BAG-1", Quantity: 1}}}, Idempotency: key, Render: render,
		})
		require.NoError(t, err)
		require.False(t, res.Replayed)
	})
}

func TestStoreCancelOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		from       orders.Status
		wantStatus orders.Status
		wantCode   orders.Code
		wantEvent  bool
	}{
		{orders.StatusPending, orders.StatusCancelling, "", true},
		{orders.StatusReserved, orders.StatusCancelling, "", true},
		{orders.StatusCancelling, orders.StatusCancelling, "", false},
		{orders.StatusCancelled, orders.StatusCancelled, "", false},
		{orders.StatusRejected, orders.StatusRejected, orders.CodeConflict, false},
	}
	for _, tc := range cases {
		t.Run(string(tc.from), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			o := b.create(t)
			b.setStatus(t, o.ID, tc.from)
			got, err := b.store.CancelOrder(ctx, o.ID, orders.EventMeta{CorrelationID: "req-cancel"})
			require.Equal(t, tc.wantCode, orders.ErrorCode(err), "error: %v", err)
			if err == nil {
				require.Equal(t, tc.wantStatus, got.Status)
			}
			rows := b.outbox(t)
			if !tc.wantEvent {
				require.Len(t, rows, 1, "only OrderCreated")
				require.Equal(t, 1, b.count(t, "order_status_history"))
				return
			}
			require.Len(t, rows, 2)
			r := rows[1]
			require.Equal(t, "OrderCancelled", r.Type)
			require.Equal(t, "order.cancelled", r.RoutingKey)
			require.Equal(t, testExchange, r.Exchange)
			require.Equal(t, o.ID.String(), r.AggregateID)
			require.Equal(t, map[string]string{"correlation_id": "req-cancel"}, r.Headers)
			require.Equal(t, float64(1), r.Payload["version"])
			require.Equal(t, o.ID.String(), r.Payload["order_id"])
			require.NotEmpty(t, r.Payload["cancelled_at"])
			require.Len(t, got.History, 2)
			require.Equal(t, tc.from, got.History[1].From)
			require.Equal(t, orders.StatusCancelling, got.History[1].To)
			require.Equal(t, orders.EventOrderCancelled, got.History[1].Event)

			again, err := b.store.CancelOrder(ctx, o.ID, orders.EventMeta{CorrelationID: "req-cancel-2"})
			require.NoError(t, err, "cancelling twice is not an error")
			require.Equal(t, orders.StatusCancelling, again.Status)
			require.Len(t, b.outbox(t), 2, "and emits nothing more")
		})
	}

	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.CancelOrder(ctx, uuid.Must(uuid.NewV7()), orders.EventMeta{})
		require.Equal(t, orders.CodeNotFound, orders.ErrorCode(err))
		_, err = b.store.Order(ctx, uuid.Must(uuid.NewV7()))
		require.Equal(t, orders.CodeNotFound, orders.ErrorCode(err))
	})
}

func TestStoreApplyStockUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t) // one database; each case has its own order
	legal := map[string]orders.Status{
		string(orders.StatusPending) + orders.EventStockReserved:    orders.StatusReserved,
		string(orders.StatusPending) + orders.EventStockRejected:    orders.StatusRejected,
		string(orders.StatusCancelling) + orders.EventStockReleased: orders.StatusCancelled,
	}
	apply := func(t *testing.T, u orders.StockUpdate) (out orders.StockOutcome) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			out, err = b.store.ApplyStockUpdate(ctx, tx, u)
			return err
		}))
		return out
	}
	for _, from := range []orders.Status{orders.StatusPending, orders.StatusReserved, orders.StatusRejected, orders.StatusCancelling, orders.StatusCancelled} {
		for _, ev := range []string{orders.EventStockReserved, orders.EventStockRejected, orders.EventStockReleased} {
			t.Run(fmt.Sprintf("%s_%s", from, ev), func(t *testing.T) {
				o := b.create(t)
				b.setStatus(t, o.ID, from)
				out := apply(t, orders.StockUpdate{Event: ev, OrderID: o.ID, Reason: "insufficient_stock", MessageID: "msg-" + o.ID.String()})
				got, err := b.store.Order(ctx, o.ID)
				require.NoError(t, err)
				want, ok := legal[string(from)+ev]
				require.True(t, out.Found)
				require.Equal(t, ok, out.Applied)
				require.Equal(t, from, out.From)
				if !ok {
					require.Equal(t, from, out.To)
					require.Equal(t, from, got.Status, "an illegal transition changes nothing")
					require.Len(t, got.History, 1)
					return
				}
				require.Equal(t, want, out.To)
				require.Equal(t, want, got.Status)
				require.Len(t, got.History, 2)
				h := got.History[1]
				require.Equal(t, from, h.From)
				require.Equal(t, want, h.To)
				require.Equal(t, ev, h.Event)
				require.Equal(t, "msg-"+o.ID.String(), h.MessageID)
				require.Equal(t, "insufficient_stock", h.Reason)
				require.False(t, got.UpdatedAt.Before(got.CreatedAt))
			})
		}
	}
	t.Run("UnknownOrder", func(t *testing.T) {
		before := b.count(t, "order_status_history")
		out := apply(t, orders.StockUpdate{Event: orders.EventStockReserved, OrderID: uuid.Must(uuid.NewV7()), MessageID: "m"})
		require.False(t, out.Found)
		require.False(t, out.Applied)
		require.Equal(t, before, b.count(t, "order_status_history"))
	})
}

func TestStoreCleanupIdempotencyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i := range 3 {
		_, err := b.store.CreateOrder(ctx, orders.CreateOrderInput{
			Request:     orders.OrderRequest{CustomerID: "c", Items: []orders.Item{{SKU: "TEE-1", Quantity: 1}}},
			Idempotency: &orders.IdempotencyKey{Key: fmt.Sprintf("key-%d", i), Fingerprint: []byte("fp")},
			Render:      render,
		})
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days' WHERE key <> 'key-2'`)
	require.NoError(t, err)
	n, err := b.store.CleanupIdempotencyKeys(ctx, 24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, 1, b.count(t, "idempotency_keys"))
	require.Equal(t, 3, b.count(t, "orders"), "the orders stay")
}

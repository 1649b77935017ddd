package postgres

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/orders"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// Exchange is the events exchange the outbox publishes OrderCreated and OrderCancelled to.
	// Required.
	Exchange string
	// OrderCreatedVersion is the version of the OrderCreated events the store writes (one of
	// orders.OrderCreatedVersions). Default orders.OrderCreatedV1.
	OrderCreatedVersion int
	// Propagator records the trace context of the writing ctx in each event's headers
	// (outbox.Store.WithPropagator); give the relay the same one. nil: the global one.
	Propagator propagation.TextMapPropagator
}

// Store is the orders repository. Every method that changes an order writes the order, its
// history row and its event (outbox.Add) in one transaction. Every method whose result the
// API answers commits through pgdb.InTx (outbox.CommitReplicated), reads included: a nil
// error means the result is on the synchronous standbys, if the server has any.
type Store struct {
	pool                DB
	exchange            string
	orderCreatedVersion int
	outbox              *outbox.Store
}

// DB is what a Store needs of its database; *pgxpool.Pool satisfies it. A test may give it
// an open transaction (see store_outbox_test.go): each method's transaction is then a
// savepoint of it, and the test can look at what the method wrote before rolling back.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Ping(ctx context.Context) error
}

var _ DB = (*pgxpool.Pool)(nil)

// NewStore returns a Store on pool, which must be migrated (Migrate).
func NewStore(pool DB, cfg StoreConfig) (*Store, error) {
	if cfg.Exchange == "" {
		return nil, errors.New("postgres store: Exchange is required")
	}
	version := cmp.Or(cfg.OrderCreatedVersion, orders.OrderCreatedV1)
	if !slices.Contains(orders.OrderCreatedVersions(), version) {
		return nil, fmt.Errorf("postgres store: OrderCreatedVersion %d: OrderCreated has versions %v", version, orders.OrderCreatedVersions())
	}
	ob, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	return &Store{pool: pool, exchange: cfg.Exchange, orderCreatedVersion: version, outbox: ob.WithPropagator(cfg.Propagator)}, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return dbError("ping", err)
	}
	return nil
}

// CreateOrder writes a PENDING order, its lines, its first history row and an OrderCreated
// event in one transaction, with in.Idempotency's key and answer when set.
//
// With an idempotency key the transaction first claims the key. When the key was already
// used (or is being used by a concurrent request, whose transaction it then waits for), nothing
// is written: the stored answer is returned with Replayed set, or CodeIdempotencyReuse when the
// request differs from the first one.
//
// Both the creation and the replay commit through pgdb.InTx (outbox.CommitReplicated), and
// only a nil error may be answered 201. The replay above all: it only reads, so a plain
// commit would wait for no standby, and the key it read may be on the primary alone (the
// first request's commit waited for the standby, its client's timeout cut the wait short,
// and that request was answered 503), to be lost with the order in a failover. So a replay
// is answered once the standby has the key and its order; while the standby cannot confirm
// it, the request times out into CodeUnavailable (503) and the client retries. A refusal
// (CodeIdempotencyReuse, CodeValidation) acknowledges nothing and rolls back.
//
// A SKU that is not in the catalogue is CodeValidation with one field error per such line.
func (s *Store) CreateOrder(ctx context.Context, in orders.CreateOrderInput) (orders.CreateOrderResult, error) {
	if in.Idempotency != nil && in.Render == nil {
		return orders.CreateOrderResult{}, errors.New("create order: Render is required with an idempotency key")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return orders.CreateOrderResult{}, fmt.Errorf("create order: new id: %w", err)
	}
	var res orders.CreateOrderResult
	err = pgdb.InTx(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		res = orders.CreateOrderResult{}
		if in.Idempotency != nil {
			replay, err := claimIdempotencyKey(ctx, tx, in.Idempotency)
			if err != nil || replay != nil {
				if replay != nil {
					res = *replay // answered only once InTx confirmed it on the standby
				}
				return err
			}
		}
		if err := checkCatalogue(ctx, tx, in.Request.Items); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertOrder, id, in.Request.CustomerID, orders.StatusPending); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		skus := make([]string, len(in.Request.Items))
		qtys := make([]int32, len(in.Request.Items))
		for i, it := range in.Request.Items {
			skus[i], qtys[i] = it.SKU, int32(it.Quantity)
		}
		if _, err := tx.Exec(ctx, insertOrderLines, id, skus, qtys); err != nil {
			return fmt.Errorf("insert order lines: %w", err)
		}
		if _, err := tx.Exec(ctx, insertHistory, id, "", orders.StatusPending, orders.EventOrderCreated, "", ""); err != nil {
			return fmt.Errorf("insert history: %w", err)
		}
		order, err := loadOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		body, err := orders.NewOrderCreated(s.orderCreatedVersion, *order)
		if err != nil {
			return err
		}
		msg, err := events.Message(s.exchange, orders.RoutingKeyOrderCreated, orders.EventOrderCreated, order.ID, in.Meta, body)
		if err != nil {
			return err
		}
		if err := s.outbox.Add(ctx, tx, msg); err != nil {
			return fmt.Errorf("add OrderCreated to the outbox: %w", err)
		}
		res.OrderID, res.Order = id, order
		if in.Idempotency != nil {
			resp, err := in.Render(order)
			if err != nil {
				return fmt.Errorf("render the answer to store: %w", err)
			}
			if _, err := tx.Exec(ctx, updateIdempotencyKey, in.Idempotency.Key, id, resp.Status, resp.Body); err != nil {
				return fmt.Errorf("store the answer of idempotency key: %w", err)
			}
			res.Response = &resp
		}
		return nil
	})
	if err != nil {
		return orders.CreateOrderResult{}, dbError("create order", err)
	}
	return res, nil
}

// claimIdempotencyKey inserts the key, or returns the answer stored with it (nil, nil when the
// key is new and now belongs to tx).
func claimIdempotencyKey(ctx context.Context, tx pgx.Tx, k *orders.IdempotencyKey) (*orders.CreateOrderResult, error) {
	tag, err := tx.Exec(ctx, insertIdempotencyKey, k.Key, k.Fingerprint)
	if err != nil {
		return nil, fmt.Errorf("claim idempotency key: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil, nil
	}
	// The key was committed by another transaction (at READ COMMITTED this statement sees it,
	// also when the INSERT above had to wait for that transaction).
	var (
		hash    []byte
		orderID *uuid.UUID
		status  *int32
		body    []byte
	)
	if err := tx.QueryRow(ctx, selectIdempotencyKey, k.Key).Scan(&hash, &orderID, &status, &body); err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	if !bytes.Equal(hash, k.Fingerprint) {
		return nil, orders.Errorf(orders.CodeIdempotencyReuse,
			"The Idempotency-Key was already used with a different request body; use a new key for a new request.")
	}
	if orderID == nil || status == nil {
		// Cannot happen: the key row is written with its answer in one transaction.
		return nil, fmt.Errorf("idempotency key %q has no stored answer", k.Key)
	}
	return &orders.CreateOrderResult{
		OrderID:  *orderID,
		Response: &orders.Response{Status: int(*status), Body: body},
		Replayed: true,
	}, nil
}

// checkCatalogue returns CodeValidation naming each line whose SKU is not a product.
func checkCatalogue(ctx context.Context, tx pgx.Tx, items []orders.Item) error {
	skus := make([]string, len(items))
	for i, it := range items {
		skus[i] = it.SKU
	}
	rows, err := tx.Query(ctx, selectProducts, skus)
	if err != nil {
		return fmt.Errorf("read products: %w", err)
	}
	known := map[string]bool{}
	var sku, name string
	_, err = pgx.ForEachRow(rows, []any{&sku, &name}, func() error {
		known[sku] = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("read products: %w", err)
	}
	var fields []orders.FieldError
	for i, it := range items {
		if !known[it.SKU] {
			fields = append(fields, orders.FieldError{
				Field:   fmt.Sprintf("items[%d].sku", i),
				Message: fmt.Sprintf("%q is not in the catalogue", it.SKU),
			})
		}
	}
	if len(fields) > 0 {
		return &orders.Error{Code: orders.CodeValidation, Message: "The order names unknown products; see errors.", Fields: fields}
	}
	return nil
}

// Order returns the order with its lines and history, or CodeNotFound.
//
// The read commits through pgdb.InTx (outbox.CommitReplicated) before the order is returned:
// a client takes GET /orders/{id}'s 200 as proof that its order exists (after a 503, say),
// and the order, or its last status change, may be on the primary alone (a commit whose wait
// for the synchronous standby was cut short, or the replay of a primary restarted after a
// crash). While the standby cannot confirm it, the read times out into CodeUnavailable. A
// CodeNotFound is answered at once: it promises nothing a failover could undo (an order
// whose commit still waits for the standby is not found yet, on either server).
func (s *Store) Order(ctx context.Context, id uuid.UUID) (*orders.Order, error) {
	var order *orders.Order
	err := pgdb.InTx(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		order, err = loadOrder(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, dbError("read order", err)
	}
	return order, nil
}

// CancelOrder asks for the cancellation of an order. A PENDING or RESERVED order becomes
// CANCELLING and an OrderCancelled event is written, in one transaction that holds the
// order's row lock; a CANCELLING or CANCELLED order is returned as it is (cancelling is
// idempotent); a REJECTED one is CodeConflict; an unknown one CodeNotFound.
//
// It commits through pgdb.InTx (outbox.CommitReplicated), whether it wrote or not: the 200
// of an order already CANCELLING or CANCELLED comes from a read, whose plain commit would
// wait for no standby, and tells the client its cancellation is under way. A refusal
// (CodeConflict, CodeNotFound) writes nothing and promises nothing; it rolls back.
func (s *Store) CancelOrder(ctx context.Context, id uuid.UUID, meta orders.EventMeta) (*orders.Order, error) {
	var order *orders.Order
	err := pgdb.InTx(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var status orders.Status
		err := tx.QueryRow(ctx, selectOrderStatusForUpdate, id).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return orders.Errorf(orders.CodeNotFound, "Order %s does not exist.", id)
		}
		if err != nil {
			return fmt.Errorf("lock order: %w", err)
		}
		switch orders.Cancel(status) {
		case orders.CancelRefused:
			return orders.Errorf(orders.CodeConflict, "Order %s is %s and can no longer be cancelled.", id, status)
		case orders.CancelStart:
			next, _ := orders.Next(status, orders.EventOrderCancelled)
			var at time.Time
			if err := tx.QueryRow(ctx, updateOrderStatus, id, next).Scan(&at); err != nil {
				return fmt.Errorf("update order status: %w", err)
			}
			if _, err := tx.Exec(ctx, insertHistory, id, status, next, orders.EventOrderCancelled, "", ""); err != nil {
				return fmt.Errorf("insert history: %w", err)
			}
			msg, err := events.Message(s.exchange, orders.RoutingKeyOrderCancelled, orders.EventOrderCancelled, id, meta, orders.OrderCancelled{
				Version: orders.EventVersion, OrderID: id, CancelledAt: at.UTC(),
			})
			if err != nil {
				return err
			}
			if err := s.outbox.Add(ctx, tx, msg); err != nil {
				return fmt.Errorf("add OrderCancelled to the outbox: %w", err)
			}
		case orders.CancelAlready:
		}
		order, err = loadOrder(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, dbError("cancel order", err)
	}
	return order, nil
}

// ApplyStockUpdate moves an order per a consumed stock event, inside tx (the inbox
// transaction of the consumed message), holding the order's row lock. An unknown order or an
// illegal transition writes nothing and is not an error: the outcome says which.
func (s *Store) ApplyStockUpdate(ctx context.Context, tx pgx.Tx, u orders.StockUpdate) (orders.StockOutcome, error) {
	var from orders.Status
	err := tx.QueryRow(ctx, selectOrderStatusForUpdate, u.OrderID).Scan(&from)
	if errors.Is(err, pgx.ErrNoRows) {
		return orders.StockOutcome{}, nil
	}
	if err != nil {
		return orders.StockOutcome{}, fmt.Errorf("lock order %s: %w", u.OrderID, err)
	}
	to, ok := orders.Next(from, u.Event)
	if !ok {
		return orders.StockOutcome{Found: true, From: from, To: from}, nil
	}
	var at time.Time
	if err := tx.QueryRow(ctx, updateOrderStatus, u.OrderID, to).Scan(&at); err != nil {
		return orders.StockOutcome{}, fmt.Errorf("update order %s status: %w", u.OrderID, err)
	}
	if _, err := tx.Exec(ctx, insertHistory, u.OrderID, from, to, u.Event, u.Reason, u.MessageID); err != nil {
		return orders.StockOutcome{}, fmt.Errorf("insert history of order %s: %w", u.OrderID, err)
	}
	return orders.StockOutcome{Found: true, From: from, To: to, Applied: true}, nil
}

// CleanupIdempotencyKeys deletes idempotency keys older than retention, in batches of at
// most batch rows, and returns how many it deleted. A retry with a deleted key creates a new
// order.
func (s *Store) CleanupIdempotencyKeys(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	var total int64
	// Not a retry loop: the first error returns (the periodic job, service.Every, backs off
	// and logs it). It goes round while a batch comes back full, so it ends once the expired
	// keys are gone.
	for {
		tag, err := s.pool.Exec(ctx, deleteIdempotencyKeys, retention, batch)
		if err != nil {
			return total, dbError("delete old idempotency keys", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// loadOrder reads an order, its lines and its history through q.
func loadOrder(ctx context.Context, q pgx.Tx, id uuid.UUID) (*orders.Order, error) {
	o := &orders.Order{}
	err := q.QueryRow(ctx, selectOrder, id).Scan(&o.ID, &o.CustomerID, &o.Status, &o.CreatedAt, &o.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, orders.Errorf(orders.CodeNotFound, "Order %s does not exist.", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read order %s: %w", id, err)
	}
	rows, err := q.Query(ctx, selectOrderLines, id)
	if err != nil {
		return nil, fmt.Errorf("read lines of order %s: %w", id, err)
	}
	var l orders.Line
	if _, err := pgx.ForEachRow(rows, []any{&l.SKU, &l.Name, &l.Quantity}, func() error {
		o.Lines = append(o.Lines, l)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read lines of order %s: %w", id, err)
	}
	rows, err = q.Query(ctx, selectOrderHistory, id)
	if err != nil {
		return nil, fmt.Errorf("read history of order %s: %w", id, err)
	}
	var h orders.StatusChange
	if _, err := pgx.ForEachRow(rows, []any{&h.From, &h.To, &h.Event, &h.Reason, &h.MessageID, &h.At}, func() error {
		o.History = append(o.History, h)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read history of order %s: %w", id, err)
	}
	return o, nil
}

// dbError wraps err, the failure of op, as internal/pgdb Wrap does for both services: a
// refusal as it is, CodeUnavailable when trying again may succeed, op: err otherwise.
func dbError(op string, err error) error { return pgdb.Wrap(op, err) }

package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// DBTX is what the queries of this package need (internal/pgdb DBTX): pgx.Tx, *pgx.Conn
// and *pgxpool.Pool satisfy it.
type DBTX = pgdb.DBTX

// ApplyOrderCreated applies an OrderCreated inside tx, the consumer's inbox transaction: it
// reserves with [Reserve] and writes the answer, StockReserved or StockRejected, to the
// outbox in the same transaction, so that the answer exists if and only if the reservation
// does. meta.CausationID is the consumed message's id, recorded with the reservation. An
// ActionIgnore writes nothing and is answered by nothing. A failure is returned as it is, for
// the consumer to roll back and retry.
func (s *Store) ApplyOrderCreated(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCreated, meta warehouse.EventMeta) (warehouse.OrderOutcome, error) {
	now := s.now()
	d, err := Reserve(ctx, tx, ev.OrderID, ev.Items, meta.CausationID, now)
	if err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("reserve order %s: %w", ev.OrderID, err)
	}
	var msg outbox.Message
	switch d.Action {
	case warehouse.ActionIgnore:
		return warehouse.OrderOutcome{Decision: d}, nil
	case warehouse.ActionReserve:
		msg, err = events.Message(s.exchange, warehouse.RoutingKeyStockReserved, warehouse.TypeStockReserved, ev.OrderID, meta,
			warehouse.NewStockReserved(ev.OrderID, ev.Items, now))
	case warehouse.ActionReject:
		msg, err = events.Message(s.exchange, warehouse.RoutingKeyStockRejected, warehouse.TypeStockRejected, ev.OrderID, meta,
			warehouse.NewStockRejected(ev.OrderID, d.Reason, d.Shortages, now))
	default:
		return warehouse.OrderOutcome{}, fmt.Errorf("order %s: unexpected decision %s", ev.OrderID, d)
	}
	if err != nil {
		return warehouse.OrderOutcome{}, err
	}
	if err := s.outbox.Add(ctx, tx, msg); err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("order %s: write %s to the outbox: %w", ev.OrderID, msg.Type, err)
	}
	return warehouse.OrderOutcome{Decision: d, AnswerID: msg.ID}, nil
}

// ApplyOrderCancelled applies an OrderCancelled inside tx, the consumer's inbox transaction:
// it releases with [Release] and writes the answer, StockReleased with what was given back,
// to the outbox in the same transaction. meta.CausationID is the consumed message's id,
// recorded with the reservation. An ActionIgnore writes nothing and is answered by nothing.
// A failure is returned as it is, for the consumer to roll back and retry.
func (s *Store) ApplyOrderCancelled(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCancelled, meta warehouse.EventMeta) (warehouse.OrderOutcome, error) {
	now := s.now()
	d, released, err := Release(ctx, tx, ev.OrderID, meta.CausationID, now)
	if err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("release order %s: %w", ev.OrderID, err)
	}
	switch d.Action {
	case warehouse.ActionIgnore:
		return warehouse.OrderOutcome{Decision: d}, nil
	case warehouse.ActionRelease, warehouse.ActionTombstone, warehouse.ActionAcknowledgeCancel:
	default:
		return warehouse.OrderOutcome{}, fmt.Errorf("order %s: unexpected decision %s", ev.OrderID, d)
	}
	msg, err := events.Message(s.exchange, warehouse.RoutingKeyStockReleased, warehouse.TypeStockReleased, ev.OrderID, meta,
		warehouse.NewStockReleased(ev.OrderID, released, now))
	if err != nil {
		return warehouse.OrderOutcome{}, err
	}
	if err := s.outbox.Add(ctx, tx, msg); err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("order %s: write %s to the outbox: %w", ev.OrderID, msg.Type, err)
	}
	return warehouse.OrderOutcome{Decision: d, Released: released, AnswerID: msg.ID}, nil
}

// Reserve applies an OrderCreated inside tx, the consumer's inbox transaction: it locks the
// order, decides with [warehouse.DecideCreated] and [warehouse.CheckStock], and records the
// outcome. lines must be merged per SKU and sorted (warehouse.DecodeOrderCreated does it).
//
//   - ActionReserve: every line is taken from stock ('reserve' ledger rows) and the
//     reservation is RESERVED.
//   - ActionReject: nothing is taken; the reservation is REJECTED with the reason, or, for a
//     tombstone, stays CANCELLED and records the late order.
//   - ActionIgnore: nothing is written.
//
// [Store.ApplyOrderCreated] writes the answer to the outbox in the same transaction.
func Reserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, lines []warehouse.Line, messageID string, now time.Time) (warehouse.Decision, error) {
	if err := lockOrder(ctx, tx, orderID); err != nil {
		return warehouse.Decision{}, err
	}
	existing, err := loadReservation(ctx, tx, orderID)
	if err != nil {
		return warehouse.Decision{}, err
	}
	d := warehouse.DecideCreated(existing)
	switch d.Action {
	case warehouse.ActionIgnore:
		return d, nil
	case warehouse.ActionReject: // a tombstone: the order arrives after its cancellation
		if _, err := tx.Exec(ctx, markCreatedSQL, orderID, messageID, now); err != nil {
			return d, dbError("record late order", err)
		}
		return d, insertLines(ctx, tx, orderID, lines)
	case warehouse.ActionReserve:
	default:
		return d, fmt.Errorf("reserve order %s: unexpected decision %s", orderID, d)
	}

	// The stock rows are locked as late as possible, since their locks are held until the
	// commit: taking stock is the first thing, and what follows it is one round trip.
	taken, err := takeStock(ctx, tx, lines, now)
	if err != nil {
		return d, err
	}
	if !taken {
		// A line is short or unknown: decide under the stock rows' locks, which also reads
		// the levels the rejection reports; stock that came back in between is reserved.
		available, err := lockStock(ctx, tx, warehouse.SKUs(lines))
		if err != nil {
			return d, err
		}
		d = warehouse.CheckStock(lines, available)
		if d.Action == warehouse.ActionReserve {
			if _, err := tx.Exec(ctx, addStockSQL, warehouse.SKUs(lines), negated(lines), now); err != nil {
				return d, dbError("update stock", err)
			}
		}
	}
	return d, recordReservation(ctx, tx, orderID, lines, d, messageID, now)
}

// recordReservation writes the reservation of an OrderCreated, its lines and, when it is
// reserved, the 'reserve' ledger rows: three statements in one round trip.
func recordReservation(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, lines []warehouse.Line, d warehouse.Decision, messageID string, now time.Time) error {
	status := warehouse.StatusRejected
	if d.Action == warehouse.ActionReserve {
		status = warehouse.StatusReserved
	}
	skus := warehouse.SKUs(lines)
	var b pgx.Batch
	b.Queue(insertReservationSQL, orderID, status, d.Reason, messageID, "", now)
	b.Queue(insertReservationLinesSQL, orderID, skus, warehouse.Quantities(lines))
	if d.Action == warehouse.ActionReserve {
		b.Queue(insertMovementsSQL, skus, negated(lines), kindReserve, orderID, messageID, now)
	}
	res := tx.SendBatch(ctx, &b)
	for _, what := range []string{"insert reservation", "insert reservation lines", "insert stock movements"}[:b.Len()] {
		if _, err := res.Exec(); err != nil {
			_ = res.Close()
			return dbError(what, err)
		}
	}
	return dbError("record reservation", res.Close())
}

// takeStock takes every line's quantity from stock, all or nothing, with one conditional
// UPDATE per line (… WHERE available >= quantity), sent in one round trip in the lines'
// order. lines are sorted by SKU, so every transaction locks the stock rows it shares with
// another in the same order and two reservations never deadlock; each row is locked by the
// UPDATE that changes it, with no SELECT … FOR UPDATE before it. When a line's SKU is
// unknown or short it returns false, with nothing taken: an order of several lines takes
// them under a savepoint and rolls back to it.
func takeStock(ctx context.Context, tx pgx.Tx, lines []warehouse.Line, now time.Time) (bool, error) {
	if len(lines) == 0 {
		return true, nil
	}
	var b pgx.Batch
	several := len(lines) > 1
	if several {
		b.Queue(takeStockSavepointSQL)
	}
	for _, l := range lines {
		b.Queue(takeStockSQL, l.SKU, l.Quantity, now)
	}
	res := tx.SendBatch(ctx, &b)
	if several {
		if _, err := res.Exec(); err != nil {
			_ = res.Close()
			return false, dbError("take stock", err)
		}
	}
	taken := true
	for _, l := range lines {
		tag, err := res.Exec()
		if err != nil {
			_ = res.Close()
			return false, dbError("take stock of "+l.SKU, err)
		}
		if tag.RowsAffected() != 1 {
			taken = false
		}
	}
	if err := res.Close(); err != nil {
		return false, dbError("take stock", err)
	}
	if !taken && several {
		if _, err := tx.Exec(ctx, takeStockRollbackSQL); err != nil {
			return false, dbError("give back stock", err)
		}
	}
	return taken, nil
}

// negated returns the lines' quantities, negative: what a reservation takes from stock.
func negated(lines []warehouse.Line) []int64 {
	q := warehouse.Quantities(lines)
	for i := range q {
		q[i] = -q[i]
	}
	return q
}

// Release applies an OrderCancelled inside tx, the consumer's inbox transaction: it locks the
// order, decides with [warehouse.DecideCancelled] and records the outcome. It returns the
// lines given back to stock (none unless the decision is ActionRelease).
//
//   - ActionRelease: the held lines go back to stock ('release' ledger rows); RELEASED.
//   - ActionTombstone: a CANCELLED reservation without lines, so a late OrderCreated
//     reserves nothing.
//   - ActionAcknowledgeCancel: the rejected reservation records the cancellation.
//   - ActionIgnore: nothing is written.
//
// [Store.ApplyOrderCancelled] writes the answer to the outbox in the same transaction.
func Release(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, messageID string, now time.Time) (warehouse.Decision, []warehouse.Line, error) {
	if err := lockOrder(ctx, tx, orderID); err != nil {
		return warehouse.Decision{}, nil, err
	}
	existing, err := loadReservation(ctx, tx, orderID)
	if err != nil {
		return warehouse.Decision{}, nil, err
	}
	d := warehouse.DecideCancelled(existing)
	switch d.Action {
	case warehouse.ActionIgnore:
		return d, nil, nil
	case warehouse.ActionTombstone:
		_, err := tx.Exec(ctx, insertReservationSQL, orderID, warehouse.StatusCancelled, warehouse.ReasonOrderCancelled, "", messageID, now)
		return d, nil, dbError("insert tombstone", err)
	case warehouse.ActionAcknowledgeCancel:
		_, err := tx.Exec(ctx, markCancelledSQL, orderID, existing.Status, existing.Reason, messageID, now)
		return d, nil, dbError("record cancellation", err)
	case warehouse.ActionRelease:
	default:
		return d, nil, fmt.Errorf("release order %s: unexpected decision %s", orderID, d)
	}

	lines := existing.Lines
	available, err := lockStock(ctx, tx, warehouse.SKUs(lines))
	if err != nil {
		return d, nil, err
	}
	if len(available) != len(lines) {
		return d, nil, fmt.Errorf("release order %s: %d of its %d SKUs are missing from stock", orderID, len(lines)-len(available), len(lines))
	}
	if err := move(ctx, tx, lines, +1, kindRelease, orderID, messageID, now); err != nil {
		return d, nil, err
	}
	if _, err := tx.Exec(ctx, markCancelledSQL, orderID, warehouse.StatusReleased, warehouse.ReasonOrderCancelled, messageID, now); err != nil {
		return d, nil, dbError("mark reservation released", err)
	}
	return d, lines, nil
}

// GetReservation returns the reservation of an order with its lines, or an error with
// CodeNotFound.
func GetReservation(ctx context.Context, db DBTX, orderID uuid.UUID) (warehouse.Reservation, error) {
	r, err := loadReservation(ctx, db, orderID)
	if err != nil {
		return warehouse.Reservation{}, err
	}
	if r == nil {
		return warehouse.Reservation{}, warehouse.Errorf(warehouse.CodeNotFound, "No reservation for order %s.", orderID)
	}
	return *r, nil
}

func lockOrder(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) error {
	if _, err := tx.Exec(ctx, lockOrderSQL, orderLockClass, orderID.String()); err != nil {
		return dbError("lock order "+orderID.String(), err)
	}
	return nil
}

// loadReservation returns the order's reservation with its lines, or nil.
func loadReservation(ctx context.Context, db DBTX, orderID uuid.UUID) (*warehouse.Reservation, error) {
	r := warehouse.Reservation{OrderID: orderID}
	err := db.QueryRow(ctx, selectReservationSQL, orderID).Scan(
		&r.Status, &r.Reason, &r.CreatedMessageID, &r.CancelledMessageID, &r.CreatedAt, &r.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, dbError("load reservation", err)
	}
	rows, err := db.Query(ctx, selectReservationLinesSQL, orderID)
	if err != nil {
		return nil, dbError("load reservation lines", err)
	}
	r.Lines, err = pgx.CollectRows(rows, pgx.RowToStructByPos[warehouse.Line])
	if err != nil {
		return nil, dbError("load reservation lines", err)
	}
	return &r, nil
}

// lockStock locks the stock rows of skus in SKU order and returns their available levels.
// Unknown SKUs are missing from the map.
func lockStock(ctx context.Context, tx pgx.Tx, skus []string) (map[string]int64, error) {
	rows, err := tx.Query(ctx, lockStockSQL, skus)
	if err != nil {
		return nil, dbError("lock stock", err)
	}
	available := make(map[string]int64, len(skus))
	var (
		sku string
		n   int64
	)
	_, err = pgx.ForEachRow(rows, []any{&sku, &n}, func() error {
		available[sku] = n
		return nil
	})
	if err != nil {
		return nil, dbError("lock stock", err)
	}
	return available, nil
}

func insertLines(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, lines []warehouse.Line) error {
	if _, err := tx.Exec(ctx, insertReservationLinesSQL, orderID, warehouse.SKUs(lines), warehouse.Quantities(lines)); err != nil {
		return dbError("insert reservation lines", err)
	}
	return nil
}

// move adds sign·quantity to the stock of every line and writes the ledger rows.
func move(ctx context.Context, tx pgx.Tx, lines []warehouse.Line, sign int64, kind string, orderID uuid.UUID, messageID string, now time.Time) error {
	skus := warehouse.SKUs(lines)
	deltas := warehouse.Quantities(lines)
	for i := range deltas {
		deltas[i] *= sign
	}
	if _, err := tx.Exec(ctx, addStockSQL, skus, deltas, now); err != nil {
		return dbError("update stock", err)
	}
	if _, err := tx.Exec(ctx, insertMovementsSQL, skus, deltas, kind, orderID, messageID, now); err != nil {
		return dbError("insert stock movements", err)
	}
	return nil
}

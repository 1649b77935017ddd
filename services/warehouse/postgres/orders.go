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
	var w writes
	d, err := reserve(ctx, tx, &w, ev.OrderID, ev.Lines, meta.CausationID, now)
	if err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("reserve order %s: %w", ev.OrderID, err)
	}
	var msg outbox.Message
	switch d.Action {
	case warehouse.ActionIgnore:
		return warehouse.OrderOutcome{Decision: d}, nil
	case warehouse.ActionReserve:
		msg, err = events.Message(s.exchange, warehouse.RoutingKeyStockReserved, warehouse.TypeStockReserved, ev.OrderID, meta,
			warehouse.NewStockReserved(ev.OrderID, ev.Lines, now))
	case warehouse.ActionReject:
		msg, err = events.Message(s.exchange, warehouse.RoutingKeyStockRejected, warehouse.TypeStockRejected, ev.OrderID, meta,
			warehouse.NewStockRejected(ev.OrderID, d.Reason, d.Shortages, now))
	default:
		return warehouse.OrderOutcome{}, fmt.Errorf("order %s: unexpected decision %s", ev.OrderID, d)
	}
	if err != nil {
		return warehouse.OrderOutcome{}, err
	}
	if err := s.answer(ctx, tx, &w, msg); err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("reserve order %s: %w", ev.OrderID, err)
	}
	return warehouse.OrderOutcome{Decision: d, AnswerID: msg.ID}, nil
}

// answer queues msg, the answer to an order's event, on w after the writes that record the
// decision, and sends them all: one round trip.
func (s *Store) answer(ctx context.Context, tx pgx.Tx, w *writes, msg outbox.Message) error {
	what := "write " + msg.Type + " to the outbox"
	queued := w.b.Len()
	if err := s.outbox.QueueAdd(ctx, &w.b, msg); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for range w.b.Len() - queued { // one statement, as QueueAdd promises; named whatever it is
		w.what = append(w.what, what)
	}
	return w.send(ctx, tx)
}

// ApplyOrderCancelled applies an OrderCancelled inside tx, the consumer's inbox transaction:
// it releases with [Release] and writes the answer, StockReleased with what was given back,
// to the outbox in the same transaction. meta.CausationID is the consumed message's id,
// recorded with the reservation. An ActionIgnore writes nothing and is answered by nothing.
// A failure is returned as it is, for the consumer to roll back and retry.
func (s *Store) ApplyOrderCancelled(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCancelled, meta warehouse.EventMeta) (warehouse.OrderOutcome, error) {
	now := s.now()
	var w writes
	d, released, err := release(ctx, tx, &w, ev.OrderID, meta.CausationID, now)
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
	if err := s.answer(ctx, tx, &w, msg); err != nil {
		return warehouse.OrderOutcome{}, fmt.Errorf("release order %s: %w", ev.OrderID, err)
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
// [Store.ApplyOrderCreated] writes the answer to the outbox in the same transaction, in the
// round trip that records the outcome.
func Reserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, lines []warehouse.Line, messageID string, now time.Time) (warehouse.Decision, error) {
	var w writes
	d, err := reserve(ctx, tx, &w, orderID, lines, messageID, now)
	if err != nil {
		return d, err
	}
	return d, w.send(ctx, tx)
}

// reserve is [Reserve] with the writes that record the outcome queued on w rather than
// sent, for the caller to send with the answer. A new order whose stock is there costs two
// round trips: the order's lock, its reservation (none yet) and the stock taken in one
// (lockLoadAndTake), then w; one that is short costs two more (the savepoint's rollback,
// when it has several lines, and the decision under the stock rows' locks).
func reserve(ctx context.Context, tx pgx.Tx, w *writes, orderID uuid.UUID, lines []warehouse.Line, messageID string, now time.Time) (warehouse.Decision, error) {
	existing, taken, err := lockLoadAndTake(ctx, tx, orderID, lines, now)
	if err != nil {
		return warehouse.Decision{}, err
	}
	d := warehouse.DecideCreated(existing)
	switch d.Action {
	case warehouse.ActionIgnore:
		return d, nil
	case warehouse.ActionReject: // a tombstone: the order arrives after its cancellation
		w.queue("record late order", markCreatedSQL, orderID, messageID, now)
		w.queue("insert reservation lines", insertReservationLinesSQL, orderID, warehouse.SKUs(lines), warehouse.Quantities(lines))
		return d, nil
	case warehouse.ActionReserve:
		// takeStockSQL took the stock if the order had no reservation, the one case in which
		// DecideCreated reserves: were that ever to change, nothing was taken.
		if existing != nil {
			return d, fmt.Errorf("reserve order %s: %s for an order with a reservation (%s): takeStockSQL took nothing", orderID, d, existing.Status)
		}
	default:
		return d, fmt.Errorf("reserve order %s: unexpected decision %s", orderID, d)
	}

	// The stock rows' locks are held until the commit: they were taken in the order's first
	// round trip, and what follows it is one more (w, with the answer).
	if !taken {
		// A line is short or unknown: decide under the stock rows' locks, which also reads
		// the levels the rejection reports; stock that came back in between is reserved.
		available, err := lockStock(ctx, tx, warehouse.SKUs(lines))
		if err != nil {
			return d, err
		}
		d = warehouse.CheckStock(lines, available)
		if d.Action == warehouse.ActionReserve {
			w.queue("update stock", addStockSQL, warehouse.SKUs(lines), negated(lines), now)
		}
	}
	recordReservation(w, orderID, lines, d, messageID, now)
	return d, nil
}

// recordReservation queues the writes of an OrderCreated's reservation on w: the
// reservation, its lines and, when it is reserved, the 'reserve' ledger rows.
func recordReservation(w *writes, orderID uuid.UUID, lines []warehouse.Line, d warehouse.Decision, messageID string, now time.Time) {
	status := warehouse.StatusRejected
	if d.Action == warehouse.ActionReserve {
		status = warehouse.StatusReserved
	}
	skus := warehouse.SKUs(lines)
	w.queue("insert reservation", insertReservationSQL, orderID, status, d.Reason, messageID, "", now)
	w.queue("insert reservation lines", insertReservationLinesSQL, orderID, skus, warehouse.Quantities(lines))
	if d.Action == warehouse.ActionReserve {
		w.queue("insert stock movements", insertMovementsSQL, skus, negated(lines), kindReserve, orderID, messageID, now)
	}
}

// writes are statements whose results the caller needs only as success or failure, queued
// to be sent in one round trip, each named for its error.
type writes struct {
	b    pgx.Batch
	what []string
}

// queue adds a statement, what naming it in its error.
func (w *writes) queue(what, sql string, args ...any) {
	w.b.Queue(sql, args...)
	w.what = append(w.what, what)
}

// send sends the queued statements in one round trip on tx, and returns the first failure,
// named. It sends nothing when nothing is queued.
func (w *writes) send(ctx context.Context, tx pgx.Tx) error {
	if w.b.Len() == 0 {
		return nil
	}
	res := tx.SendBatch(ctx, &w.b)
	for _, what := range w.what {
		if _, err := res.Exec(); err != nil {
			_ = res.Close()
			return dbError(what, err)
		}
	}
	return dbError("record the outcome", res.Close())
}

// lockLoadAndTake sends in one round trip the order's lock, the reads of its reservation
// and lines (lockAndLoad), and the stock of every line taken, all or nothing, if the order has
// no reservation yet: one conditional UPDATE per line (takeStockSQL: … WHERE available >=
// quantity AND the order has no reservation), in the lines' order. lines are sorted by SKU,
// so every transaction locks the stock rows it shares with another in the same order and two
// reservations never deadlock; each row is locked by the UPDATE that changes it, with no
// SELECT … FOR UPDATE before it. Each statement of the round trip runs after the one before
// it, with a snapshot of its own: the UPDATEs see the reservation that the reads saw, since
// the order's lock, granted first, keeps any other from being written meanwhile.
//
// It returns the reservation (nil if none) and, for an order without one, whether the stock
// was taken: false when a line's SKU is unknown or short, with nothing taken (an order of
// several lines takes them under a savepoint and rolls back to it, a second round trip). For
// an order with a reservation nothing is taken, and taken is false.
func lockLoadAndTake(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, lines []warehouse.Line, now time.Time) (existing *warehouse.Reservation, taken bool, err error) {
	var b pgx.Batch
	queueLockAndLoad(&b, orderID)
	several := len(lines) > 1
	if several {
		b.Queue(takeStockSavepointSQL)
	}
	for _, l := range lines {
		b.Queue(takeStockSQL, l.SKU, l.Quantity, now, orderID)
	}
	res := tx.SendBatch(ctx, &b)
	existing, err = readReservation(res, orderID)
	if err == nil {
		taken, err = readTaken(res, lines, several)
	}
	if closeErr := res.Close(); err == nil && closeErr != nil {
		err = dbError("lock order "+orderID.String()+" and take stock", closeErr)
	}
	if err != nil {
		return nil, false, err
	}
	if existing != nil {
		return existing, false, nil // the UPDATEs changed nothing
	}
	if !taken && several {
		if _, err := tx.Exec(ctx, takeStockRollbackSQL); err != nil {
			return nil, false, dbError("give back stock", err)
		}
	}
	return nil, taken, nil
}

// readTaken reads the results of lockLoadAndTake's UPDATEs: whether each changed its row.
func readTaken(res pgx.BatchResults, lines []warehouse.Line, several bool) (bool, error) {
	if several {
		if _, err := res.Exec(); err != nil {
			return false, dbError("take stock", err)
		}
	}
	taken := true
	for _, l := range lines {
		tag, err := res.Exec()
		if err != nil {
			return false, dbError("take stock of "+l.SKU, err)
		}
		if tag.RowsAffected() != 1 {
			taken = false
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
// [Store.ApplyOrderCancelled] writes the answer to the outbox in the same transaction, in the
// round trip that records the outcome.
func Release(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, messageID string, now time.Time) (warehouse.Decision, []warehouse.Line, error) {
	var w writes
	d, lines, err := release(ctx, tx, &w, orderID, messageID, now)
	if err != nil {
		return d, nil, err
	}
	return d, lines, w.send(ctx, tx)
}

// release is [Release] with the writes that record the outcome queued on w rather than
// sent, for the caller to send with the answer.
func release(ctx context.Context, tx pgx.Tx, w *writes, orderID uuid.UUID, messageID string, now time.Time) (warehouse.Decision, []warehouse.Line, error) {
	existing, err := lockAndLoad(ctx, tx, orderID)
	if err != nil {
		return warehouse.Decision{}, nil, err
	}
	d := warehouse.DecideCancelled(existing)
	switch d.Action {
	case warehouse.ActionIgnore:
		return d, nil, nil
	case warehouse.ActionTombstone:
		w.queue("insert tombstone", insertReservationSQL, orderID, warehouse.StatusCancelled, warehouse.ReasonOrderCancelled, "", messageID, now)
		return d, nil, nil
	case warehouse.ActionAcknowledgeCancel:
		w.queue("record cancellation", markCancelledSQL, orderID, existing.Status, existing.Reason, messageID, now)
		return d, nil, nil
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
	skus, deltas := warehouse.SKUs(lines), warehouse.Quantities(lines)
	w.queue("update stock", addStockSQL, skus, deltas, now)
	w.queue("insert stock movements", insertMovementsSQL, skus, deltas, kindRelease, orderID, messageID, now)
	w.queue("mark reservation released", markCancelledSQL, orderID, warehouse.StatusReleased, warehouse.ReasonOrderCancelled, messageID, now)
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

// lockAndLoad takes the order's lock and reads its reservation with its lines (nil if it
// has none) in one round trip: the reads run after the lock is granted, so they see what
// the order's previous transaction committed.
func lockAndLoad(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (*warehouse.Reservation, error) {
	var b pgx.Batch
	queueLockAndLoad(&b, orderID)
	res := tx.SendBatch(ctx, &b)
	r, err := readReservation(res, orderID)
	if closeErr := res.Close(); err == nil && closeErr != nil {
		err = dbError("lock and load order "+orderID.String(), closeErr)
	}
	return r, err
}

// queueLockAndLoad queues lockAndLoad's statements on b.
func queueLockAndLoad(b *pgx.Batch, orderID uuid.UUID) {
	b.Queue(lockOrderSQL, orderLockClass, orderID.String())
	b.Queue(selectReservationSQL, orderID)
	b.Queue(selectReservationLinesSQL, orderID)
}

// readReservation reads the results of queueLockAndLoad's statements.
func readReservation(res pgx.BatchResults, orderID uuid.UUID) (*warehouse.Reservation, error) {
	if _, err := res.Exec(); err != nil {
		return nil, dbError("lock order "+orderID.String(), err)
	}
	r := warehouse.Reservation{OrderID: orderID}
	err := res.QueryRow().Scan(&r.Status, &r.Reason, &r.CreatedMessageID, &r.CancelledMessageID, &r.CreatedAt, &r.UpdatedAt)
	found := !errors.Is(err, pgx.ErrNoRows)
	if err != nil && found {
		return nil, dbError("load reservation", err)
	}
	rows, err := res.Query()
	if err != nil {
		return nil, dbError("load reservation lines", err)
	}
	r.Lines, err = pgx.CollectRows(rows, pgx.RowToStructByPos[warehouse.Line])
	if err != nil {
		return nil, dbError("load reservation lines", err)
	}
	if !found {
		return nil, nil
	}
	return &r, nil
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

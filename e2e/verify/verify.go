// Package verify proves, from the two services' databases, that the shop kept its promises:
// nothing acknowledged was lost, nothing was applied twice, every saga finished, and the
// outboxes drained. The end-to-end test and the chaos scenarios share it.
//
// It reads both databases, which no service ever does: it is the auditor, not a participant.
package verify

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DB is what the checks need of a database handle (*pgxpool.Pool, *pgx.Conn).
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Expectation is what the client side knows.
type Expectation struct {
	// Acknowledged maps each Idempotency-Key that got a 201 to the order id in the answer.
	Acknowledged map[string]string
	// InitialStock is the stock of each SKU before the first order.
	InitialStock map[string]int64
	// DeadOutboxRows is how many dead outbox rows the scenario injected on purpose (per
	// service: "orders", "warehouse").
	DeadOutboxRows map[string]int
}

// Report is what the databases say.
type Report struct {
	Orders        int            // orders in the orders database
	ByStatus      map[string]int // orders per status
	Stuck         []string       // orders not in a final status
	Problems      []string       // broken invariants; empty means all held
	PendingOutbox map[string]int // per service
	DeadOutbox    map[string]int // per service
}

// OK reports whether every invariant held.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Final statuses of an order.
var final = []string{"RESERVED", "REJECTED", "CANCELLED"}

// Run checks every invariant and returns the report; an error means a database could not
// be read, not that an invariant failed.
func Run(ctx context.Context, orders, warehouse DB, want Expectation) (Report, error) {
	r := Report{ByStatus: map[string]int{}, PendingOutbox: map[string]int{}, DeadOutbox: map[string]int{}}
	fail := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	// Orders, as the orders service sees them.
	status := map[string]string{}
	if err := collect(ctx, orders, `SELECT id::text, status FROM orders`, func(rows pgx.Rows) error {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			return err
		}
		status[id] = st
		r.ByStatus[st]++
		if !slices.Contains(final, st) {
			r.Stuck = append(r.Stuck, id)
		}
		return nil
	}); err != nil {
		return r, fmt.Errorf("read orders: %w", err)
	}
	r.Orders = len(status)
	slices.Sort(r.Stuck)
	if len(r.Stuck) > 0 {
		fail("%d orders did not reach a final status: %s", len(r.Stuck), abbreviate(r.Stuck))
	}

	// Every acknowledged order exists; one order per key; no order without a key's answer.
	acked := map[string]bool{}
	for key, id := range want.Acknowledged {
		if _, ok := status[id]; !ok {
			fail("order %s acknowledged for key %s does not exist", id, key)
		}
		if acked[id] {
			fail("order %s was acknowledged for two keys", id)
		}
		acked[id] = true
	}
	var keyed, keys int
	if err := orders.QueryRow(ctx, `SELECT count(DISTINCT order_id), count(*) FROM idempotency_keys WHERE order_id IS NOT NULL`).Scan(&keyed, &keys); err != nil {
		return r, fmt.Errorf("read idempotency keys: %w", err)
	}
	if keyed != keys {
		fail("%d idempotency keys point at only %d orders", keys, keyed)
	}

	// Reservations, as the warehouse sees them.
	reservation := map[string]string{}
	if err := collect(ctx, warehouse, `SELECT order_id::text, status FROM reservations`, func(rows pgx.Rows) error {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			return err
		}
		reservation[id] = st
		return nil
	}); err != nil {
		return r, fmt.Errorf("read reservations: %w", err)
	}
	for _, id := range slices.Sorted(maps.Keys(status)) {
		st, res := status[id], reservation[id]
		switch {
		case st == "RESERVED" && res != "RESERVED":
			fail("order %s is RESERVED but its reservation is %q", id, res)
		case st == "REJECTED" && res != "REJECTED":
			fail("order %s is REJECTED but its reservation is %q", id, res)
		case st == "CANCELLED" && res == "RESERVED":
			fail("order %s is CANCELLED but the warehouse still holds its stock", id)
		}
	}
	for id, res := range reservation {
		if _, ok := status[id]; !ok {
			fail("reservation %s (%s) has no order", id, res)
		}
	}

	// Each order's effect applied exactly once: per order and SKU, one reserve movement at
	// most, one release at most, and they match the reservation's state and lines.
	if err := collect(ctx, warehouse, movementsCheck, func(rows pgx.Rows) error {
		var problem string
		if err := rows.Scan(&problem); err != nil {
			return err
		}
		fail("%s", problem)
		return nil
	}); err != nil {
		return r, fmt.Errorf("check movements: %w", err)
	}

	// Stock: initial = available + held by active reservations; never negative.
	if err := collect(ctx, warehouse, stockCheck, func(rows pgx.Rows) error {
		var sku string
		var available, held int64
		if err := rows.Scan(&sku, &available, &held); err != nil {
			return err
		}
		if available < 0 {
			fail("stock of %s is negative: %d", sku, available)
		}
		if initial, ok := want.InitialStock[sku]; ok && initial != available+held {
			fail("stock of %s: initial %d != available %d + held %d", sku, initial, available, held)
		}
		return nil
	}); err != nil {
		return r, fmt.Errorf("check stock: %w", err)
	}

	// Outboxes drained; nothing dead but what was injected.
	for name, db := range map[string]DB{"orders": orders, "warehouse": warehouse} {
		var pending, dead int
		if err := db.QueryRow(ctx, outboxCheck).Scan(&pending, &dead); err != nil {
			return r, fmt.Errorf("read %s outbox: %w", name, err)
		}
		r.PendingOutbox[name], r.DeadOutbox[name] = pending, dead
		if pending > 0 {
			fail("%s outbox has %d pending rows", name, pending)
		}
		if dead != want.DeadOutboxRows[name] {
			fail("%s outbox has %d dead rows, want %d", name, dead, want.DeadOutboxRows[name])
		}
	}
	slices.Sort(r.Problems)
	return r, nil
}

const movementsCheck = `
WITH per_order AS (
  SELECT order_id, sku,
         count(*) FILTER (WHERE kind = 'reserve') AS reserves,
         count(*) FILTER (WHERE kind = 'release') AS releases,
         coalesce(sum(-delta) FILTER (WHERE kind = 'reserve'), 0) AS reserved,
         coalesce(sum(delta) FILTER (WHERE kind = 'release'), 0) AS released
  FROM stock_movements WHERE order_id IS NOT NULL GROUP BY order_id, sku
)
SELECT format('order %s, %s: %s reserve and %s release movements', order_id, sku, reserves, releases)
FROM per_order WHERE reserves > 1 OR releases > 1 OR releases > reserves
UNION ALL
SELECT format('order %s (%s): its line of %s %s, but its movements hold %s', r.order_id, r.status, l.quantity, l.sku,
              coalesce(p.reserved, 0) - coalesce(p.released, 0))
FROM reservations r
JOIN reservation_lines l ON l.order_id = r.order_id
LEFT JOIN per_order p ON p.order_id = r.order_id AND p.sku = l.sku
WHERE (r.status = 'RESERVED' AND coalesce(p.reserved, 0) - coalesce(p.released, 0) <> l.quantity)
   OR (r.status <> 'RESERVED' AND coalesce(p.reserved, 0) - coalesce(p.released, 0) <> 0)`

const stockCheck = `
SELECT s.sku, s.available,
       coalesce((SELECT sum(l.quantity) FROM reservation_lines l JOIN reservations r ON r.order_id = l.order_id
                 WHERE r.status = 'RESERVED' AND l.sku = s.sku), 0)
FROM stock s`

const outboxCheck = `
SELECT count(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL),
       count(*) FILTER (WHERE dead_at IS NOT NULL)
FROM outbox_messages`

func collect(ctx context.Context, db DB, sql string, row func(pgx.Rows) error) error {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func abbreviate(ids []string) string {
	if len(ids) > 10 {
		return strings.Join(ids[:10], ", ") + fmt.Sprintf(" and %d more", len(ids)-10)
	}
	return strings.Join(ids, ", ")
}

package chaos

import (
	"context"
	"fmt"

	"github.com/outboxshop/outboxshop/e2e/verify"
)

// audit counts, from the two databases, what the table reports as lost and as applied twice.
// verify.Run decides whether every invariant held; the audit puts numbers on the two that the
// chaos scenarios are about.
type audit struct {
	// Missing counts acknowledged orders that are not in the orders database.
	Missing int
	// Orphans counts orders in the database that no client was told about (its client gave
	// up, or its answer was lost and never replayed).
	Orphans int
	// Twice lists each kind of double application found, with its count.
	Twice map[string]int
}

// DoubleApplied is the number of effects applied more than once, of every kind.
func (a audit) DoubleApplied() int {
	n := 0
	for _, c := range a.Twice {
		n += c
	}
	return n
}

// The double applications the audit looks for. A second reserve or release movement for one
// order and SKU cannot even be written (a unique index forbids it), a second state change
// caused by one message could; a second answer of the warehouse to one order, or a second
// event of one kind for one order, means a message was applied twice.
var twiceQueries = []struct {
	db, what, sql string
}{
	{"orders", "state changes caused twice by one message", `
SELECT count(*) FROM (SELECT 1 FROM order_status_history WHERE message_id IS NOT NULL
                      GROUP BY order_id, message_id HAVING count(*) > 1) d`},
	{"orders", "orders with two events of one type", `
SELECT count(*) FROM (SELECT 1 FROM outbox_messages GROUP BY aggregate_type, aggregate_id, type HAVING count(*) > 1) d`},
	{"warehouse", "stock movements applied twice", `
SELECT count(*) FROM (SELECT 1 FROM stock_movements WHERE order_id IS NOT NULL
                      GROUP BY order_id, sku, kind HAVING count(*) > 1) d`},
	{"warehouse", "orders answered twice with one event type", `
SELECT count(*) FROM (SELECT 1 FROM outbox_messages GROUP BY aggregate_type, aggregate_id, type HAVING count(*) > 1) d`},
	{"warehouse", "messages recorded twice in the inbox", `
SELECT count(*) FROM (SELECT 1 FROM inbox_messages GROUP BY consumer, message_id HAVING count(*) > 1) d`},
}

func runAudit(ctx context.Context, orders, warehouse verify.DB, acknowledged map[string]string) (audit, error) {
	a := audit{Twice: map[string]int{}}
	ids := map[string]bool{}
	rows, err := orders.Query(ctx, `SELECT id::text FROM orders`)
	if err != nil {
		return a, fmt.Errorf("audit: read orders: %w", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return a, fmt.Errorf("audit: read orders: %w", err)
		}
		ids[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return a, fmt.Errorf("audit: read orders: %w", err)
	}
	told := map[string]bool{}
	for _, id := range acknowledged {
		told[id] = true
		if !ids[id] {
			a.Missing++
		}
	}
	for id := range ids {
		if !told[id] {
			a.Orphans++
		}
	}
	for _, q := range twiceQueries {
		db := orders
		if q.db == "warehouse" {
			db = warehouse
		}
		var n int
		if err := db.QueryRow(ctx, q.sql).Scan(&n); err != nil {
			return a, fmt.Errorf("audit: %s (%s): %w", q.what, q.db, err)
		}
		if n > 0 {
			a.Twice[q.db+": "+q.what] = n
		}
	}
	return a, nil
}

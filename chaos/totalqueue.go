package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ---- the total-queue check (Jepsen's): every message the broker confirmed is consumed ----

// confirmedRows reads the outbox rows a relay marked published, which it does only once the
// broker confirmed them: id and type.
const confirmedRows = `SELECT id::text, type FROM outbox_messages WHERE published_at IS NOT NULL`

// consumedRows reads the messages an inbox recorded, which it does in the transaction of
// their effect: message id and type.
const consumedRows = `SELECT DISTINCT message_id, message_type FROM inbox_messages`

// flow is one direction of the shop's messages: one service's outbox to the other's inbox.
type flow struct{ from, to string }

// unconsumed returns, of the confirmed messages (id → type), those missing from the consumed
// ones, by type; only types the consumer took at least one of count, since a service
// consumes only the types its queue is bound to.
func unconsumed(confirmed, consumed map[string]string) (missing map[string][]string, checked int) {
	takes := map[string]bool{}
	for _, typ := range consumed {
		takes[typ] = true
	}
	missing = map[string][]string{}
	for id, typ := range confirmed {
		if !takes[typ] {
			continue
		}
		checked++
		if _, ok := consumed[id]; !ok {
			missing[typ] = append(missing[typ], id)
		}
	}
	for typ := range missing {
		slices.Sort(missing[typ])
	}
	return missing, checked
}

// checkEveryConfirmedConsumed is the total-queue check: every message that a relay had
// confirmed by the broker (its row marked published) was consumed by the other service (its
// inbox row committed with its effect), in both directions; and, with the audit's check of
// inbox rows recorded twice, none twice past the inbox.
func checkEveryConfirmedConsumed(ctx context.Context, e *Env, o *Outcome) {
	fail := func(format string, args ...any) { o.Failures = append(o.Failures, fmt.Sprintf(format, args...)) }
	read := func(url, query string) (map[string]string, error) {
		conn, err := openDB(ctx, url)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rows, err := conn.Query(ctx, query)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		var id, typ string
		_, err = pgx.ForEachRow(rows, []any{&id, &typ}, func() error {
			out[id] = typ
			return nil
		})
		return out, err
	}
	dbs := map[string]string{"orders": e.Endpoints.OrdersDB, "warehouse": e.Endpoints.WarehouseDB}
	var seen []string
	for _, f := range []flow{{"orders", "warehouse"}, {"warehouse", "orders"}} {
		confirmed, err := read(dbs[f.from], confirmedRows)
		if err != nil {
			fail("total-queue check: read the %s outbox: %v", f.from, err)
			return
		}
		consumed, err := read(dbs[f.to], consumedRows)
		if err != nil {
			fail("total-queue check: read the %s inbox: %v", f.to, err)
			return
		}
		missing, checked := unconsumed(confirmed, consumed)
		seen = append(seen, fmt.Sprintf("%s → %s: %d confirmed (%d of types it consumes), %d not consumed", f.from, f.to,
			len(confirmed), checked, countAll(missing)))
		for _, typ := range slices.Sorted(maps.Keys(missing)) {
			ids := missing[typ]
			fail("total-queue check: %d %s confirmed to the %s relay never consumed by %s (e.g. %s)",
				len(ids), typ, f.from, f.to, strings.Join(ids[:min(3, len(ids))], ", "))
		}
	}
	e.Saw("total-queue check (confirmed by the broker, then consumed): %s", strings.Join(seen, "; "))
}

func countAll(m map[string][]string) int {
	n := 0
	for _, ids := range m {
		n += len(ids)
	}
	return n
}

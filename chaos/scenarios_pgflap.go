package chaos

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- pg-flap-failover: the standby away, the primary crash-restarted, then replaced ----

// Timings and bounds of pg-flap-failover.
const (
	// flapStandbyAt is when the standby is killed, into the load.
	flapStandbyAt = 2 * time.Second
	// flapCrashes is how often the primary is SIGKILLed and started again while its standby
	// is away, before it is killed for good.
	flapCrashes = 2
	// flapRetried is how many clients must have retried after a failure of each step (a
	// commit that timed out waiting for the standby, a connection the crash cut) before the
	// next step: the retries are what a commit on the primary alone answers 201.
	flapRetried = 4
	// flapStepBound bounds the wait for them: the API answers 503 once its database timeout
	// (5s) cancelled the commit's wait, and the client retries after the Retry-After (5s).
	flapStepBound = 20 * time.Second
	// flapSettle is how long a step goes on once the retries were sent: long enough for a
	// replay to be answered, short enough that the clients' next orders are in flight at the
	// next crash.
	flapSettle = time.Second
)

// ordersWithKeys reads every order of a server with its idempotency key ("" when none).
const ordersWithKeys = `
SELECT o.id::text, coalesce(k.key, '') FROM orders o LEFT JOIN idempotency_keys k ON k.order_id = o.id`

// reservedOrders reads the orders the warehouse holds a reservation for, with its status.
const reservedOrders = `SELECT order_id::text, status FROM reservations`

// flap is what pg-flap-failover's Inject learns and its Check verifies.
type flap struct {
	mu sync.Mutex
	// old are the orders visible on the old primary just before its last kill, by id, with
	// their keys.
	old map[string]string
	// standbyGone, lastKill are when the standby was killed and the primary for good.
	standbyGone, lastKill time.Time
}

func pgFlapFailoverScenario() Scenario {
	f := &flap{}
	return Scenario{
		Name: "pg-flap-failover",
		Summary: "the orders primary's synchronous standby killed mid-load (commits wait, time out, clients retry), the primary crash-restarted " +
			"twice, then killed for good and the standby promoted without its last WAL: every 201 survives, nothing was consumed for an order that is gone",
		OrdersStandby: true,
		RecordAnswers: true,
		// Orders must go on after the promotion: the clients retrying through the outage
		// reach the new primary, and new orders complete on it.
		LoadAfterInject: 5 * time.Second,
		Inject:          f.inject,
		Check:           f.check,
	}
}

func init() { register(pgFlapFailoverScenario()) }

func (f *flap) inject(ctx context.Context, e *Env) error {
	f.mu.Lock()
	f.old, f.standbyGone, f.lastKill = nil, time.Time{}, time.Time{}
	f.mu.Unlock()
	if len(e.Endpoints.OrdersDBServers) != 2 {
		return fmt.Errorf("the orders database has no standby (%d servers)", len(e.Endpoints.OrdersDBServers))
	}
	if e.Answers == nil {
		return fmt.Errorf("the load's answers are not recorded")
	}
	if !e.AtLoad(ctx, flapStandbyAt) {
		return ctx.Err()
	}

	// 1. The standby goes away: every commit on the primary waits for it.
	gone := time.Now()
	if err := e.Target.Kill(ctx, OrdersDBStandby); err != nil {
		return fmt.Errorf("kill the standby: %w", err)
	}
	f.mu.Lock()
	f.standbyGone = gone
	f.mu.Unlock()
	e.Fault(gone, "orders PostgreSQL standby SIGKILLed: the primary's commits wait for it (synchronous_standby_names)")
	cpu := e.outageStarts(ctx, "the orders standby was away")
	if err := f.awaitRetries(ctx, e, gone, "the standby's kill"); err != nil {
		return err
	}

	// 2. The primary crashes and recovers, its standby still away: what it replays from its
	// WAL is visible on it, and on it alone.
	for i := 1; i <= flapCrashes; i++ {
		// Before the kill: the requests it cuts are answered while Kill waits for the
		// backends to be gone, and they are what the step waits for.
		crashed := time.Now()
		if err := e.Target.Kill(ctx, OrdersDB); err != nil {
			return fmt.Errorf("kill the primary: %w", err)
		}
		if err := e.Target.Restart(ctx, OrdersDB); err != nil {
			return fmt.Errorf("restart the primary: %w", err)
		}
		e.Fault(crashed, "orders primary SIGKILLed and started again (crash %d of %d, back after %.1fs), its standby still away",
			i, flapCrashes, time.Since(crashed).Seconds())
		if err := f.awaitRetries(ctx, e, crashed, fmt.Sprintf("crash %d", i)); err != nil {
			return err
		}
	}

	// 3. What the old primary has, just before it dies for good.
	old, err := readOrders(ctx, e.Endpoints.OrdersDBServers[0])
	if err != nil {
		return fmt.Errorf("read the old primary's orders: %w", err)
	}
	killed := time.Now()
	if err := e.Target.Kill(ctx, OrdersDB); err != nil {
		return fmt.Errorf("kill the primary: %w", err)
	}
	f.mu.Lock()
	f.old, f.lastKill = old, killed
	f.mu.Unlock()
	e.Fault(killed, "orders primary SIGKILLed for good, %d orders visible on it", len(old))
	failed := failedIn(e.Answers.all(), gone, killed)
	if failed == 0 {
		return fmt.Errorf("no order failed while the standby was away: the primary's commits never waited for it")
	}

	// 4. The standby comes back, without what the primary wrote since its kill, and is
	// promoted: a failover manager's choice when the primary is lost.
	if err := e.Target.Restart(ctx, OrdersDBStandby); err != nil {
		return fmt.Errorf("start the standby again: %w", err)
	}
	if err := e.Target.Promote(ctx, OrdersDB); err != nil {
		return fmt.Errorf("promote the standby: %w", err)
	}
	e.outageEnds(ctx, cpu)
	promoted := time.Now()
	e.Healed("standby started again (%.1fs after the primary's kill) and promoted; %d clients' orders failed while it was away",
		promoted.Sub(killed).Seconds(), failed)

	// The services recover by themselves: their pools connect to the new primary.
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		get := probeStatus(ctx, http.MethodGet, e.Endpoints.OrdersURL+"/orders/"+e.Probe.ID, "", nil)
		post := probeStatus(ctx, http.MethodPost, e.Endpoints.OrdersURL+"/orders", e.Probe.Key, e.Probe.Body)
		return get == http.StatusOK && post == http.StatusCreated, nil
	})
	if err != nil {
		return fmt.Errorf("the API never answered again after the promotion: %w", err)
	}
	e.Saw("API answers again %.1fs after the promotion (%.1fs after the standby's kill)",
		time.Since(promoted).Seconds(), time.Since(gone).Seconds())
	return nil
}

// awaitRetries waits until flapRetried clients retried after an attempt that failed since
// step (at most flapStepBound), and flapSettle more.
func (f *flap) awaitRetries(ctx context.Context, e *Env, since time.Time, step string) error {
	bound, cancel := context.WithTimeout(ctx, flapStepBound)
	defer cancel()
	err := poll(bound, 100*time.Millisecond, func() (bool, error) {
		return retriedSince(e.Answers.all(), since) >= flapRetried, nil
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	all := e.Answers.all()
	n, failed := retriedSince(all, since), failedIn(all, since, time.Now())
	if err != nil {
		e.Saw("after %s, %d clients' orders failed and %d retried within %s (waited for %d)", step, failed, n, flapStepBound, flapRetried)
	} else {
		e.Saw("after %s, %d clients' orders failed and %d retried within %.1fs", step, failed, n, time.Since(since).Seconds())
	}
	if !sleepCtx(ctx, flapSettle) {
		return ctx.Err()
	}
	return nil
}

// readOrders reads every order of the database at url, by id, with its key.
func readOrders(ctx context.Context, url string) (map[string]string, error) {
	conn, err := openDB(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return collectPairs(ctx, conn, ordersWithKeys)
}

// collectPairs reads a query of two text columns into a map from the first to the second.
func collectPairs(ctx context.Context, conn *pgx.Conn, sql string) (map[string]string, error) {
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var a, b string
	_, err = pgx.ForEachRow(rows, []any{&a, &b}, func() error {
		out[a] = b
		return nil
	})
	return out, err
}

// flapLoss is what the failover took from what clients were told.
type flapLoss struct {
	// Lost are the acknowledged keys whose order is not on the new primary, or whose key
	// points elsewhere there; each with the order id its client holds.
	Lost map[string]string
	// OnlyOld are the orders visible on the old primary at its last kill and missing on the
	// new one; OnlyOldAcked those of them a client was answered 201 for.
	OnlyOld, OnlyOldAcked []string
	// Orphaned are the orders the warehouse holds a reservation for that the orders
	// database does not have.
	Orphaned []string
}

// compareFailover compares what clients were told (acked: key → order id), what the old
// primary had (old: order id → key), what the new one has (orders: order id → key) and
// the warehouse's reservations (order id → status).
func compareFailover(acked, old, orders, reservations map[string]string) flapLoss {
	l := flapLoss{Lost: map[string]string{}}
	keyOf := map[string]string{} // on the new primary: key → order id
	for id, key := range orders {
		if key != "" {
			keyOf[key] = id
		}
	}
	told := map[string]bool{}
	for key, id := range acked {
		told[id] = true
		if _, ok := orders[id]; !ok || keyOf[key] != id {
			l.Lost[key] = id
		}
	}
	for id := range old {
		if _, ok := orders[id]; !ok {
			l.OnlyOld = append(l.OnlyOld, id)
			if told[id] {
				l.OnlyOldAcked = append(l.OnlyOldAcked, id)
			}
		}
	}
	for id := range reservations {
		if _, ok := orders[id]; !ok {
			l.Orphaned = append(l.Orphaned, id)
		}
	}
	slices.Sort(l.OnlyOld)
	slices.Sort(l.OnlyOldAcked)
	slices.Sort(l.Orphaned)
	return l
}

// check compares what the clients were told with what the new primary has: every 201 with
// its order and key, no reservation for an order that is gone; and the orders processes on
// the new primary, none of them restarted.
func (f *flap) check(ctx context.Context, e *Env, o *Outcome) {
	f.mu.Lock()
	old, gone, killed := f.old, f.standbyGone, f.lastKill
	f.mu.Unlock()
	fail := func(format string, args ...any) { o.Failures = append(o.Failures, fmt.Sprintf(format, args...)) }
	if old == nil {
		return // inject failed, and said why
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDBServers[1])
	if err != nil {
		fail("connect to the new primary: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	orders, err := collectPairs(ctx, conn, ordersWithKeys)
	if err != nil {
		fail("read the new primary's orders: %v", err)
		return
	}
	wconn, err := openDB(ctx, e.Endpoints.WarehouseDB)
	if err != nil {
		fail("connect to the warehouse database: %v", err)
		return
	}
	defer wconn.Close(context.WithoutCancel(ctx))
	reservations, err := collectPairs(ctx, wconn, reservedOrders)
	if err != nil {
		fail("read the reservations: %v", err)
		return
	}

	acked := maps.Clone(e.Result.Acknowledged)
	delete(acked, e.Probe.Key)
	loss := compareFailover(acked, old, orders, reservations)
	attempts := e.Answers.all()
	keys := byKey(attempts)
	afterFailure := ackedAfterFailure(attempts)
	in := func(from, to time.Time) int {
		n := 0
		for _, a := range attempts {
			if a.Status == http.StatusCreated && !a.Sent.Before(from) && a.Answered.Before(to) {
				n++
			}
		}
		return n
	}
	e.Saw("%d orders answered 201 (%d of them first after a failed attempt, by a replay); %d requests sent while the standby was away answered 201 before the primary's last kill; %d retries, %d replays",
		len(acked), len(afterFailure), in(gone, killed), e.Result.Retries, e.Result.Replays)
	e.Saw("%d orders visible on the old primary at its last kill are not on the new one (%d of them answered 201 to their client)%s",
		len(loss.OnlyOld), len(loss.OnlyOldAcked), sampleIDs(abbreviateIDs(loss.OnlyOld, 5)))

	if len(loss.Lost) > 0 {
		var each []string
		for _, key := range slices.Sorted(maps.Keys(loss.Lost)) {
			id := loss.Lost[key]
			where := "not on the new primary"
			if _, ok := orders[id]; ok {
				where = "on the new primary without its key"
			}
			if _, ok := old[id]; ok {
				where += ", but was on the old one"
			}
			each = append(each, fmt.Sprintf("order %s (key %s; answers %s): %s", id, key, history(keys[key], e.LoadStart), where))
		}
		fail("%d orders answered 201 are gone after the failover: %s", len(each), strings.Join(abbreviateIDs(each, 5), "; "))
	}
	if len(loss.Orphaned) > 0 {
		fail("the warehouse holds reservations for %d orders the orders database does not have (their OrderCreated was published from the old primary alone): %s",
			len(loss.Orphaned), strings.Join(abbreviateIDs(loss.Orphaned, 5), ", "))
	}

	checkFollowedFailover(ctx, e, conn, false, fail)
}

// abbreviateIDs keeps the first n of items, and says how many more there were.
func abbreviateIDs(items []string, n int) []string {
	if len(items) <= n {
		return items
	}
	return append(slices.Clone(items[:n]), fmt.Sprintf("and %d more", len(items)-n))
}

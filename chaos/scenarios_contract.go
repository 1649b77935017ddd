package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	inboxrabbitmq "github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// ---- contract-change ----

// The settings of the contract change (docs/events.md#changing-an-event): what the orders
// API writes, and what the warehouse reads, before and after each deploy.
const (
	writeV1   = "ORDERS_ORDER_CREATED_VERSION=1"
	writeV2   = "ORDERS_ORDER_CREATED_VERSION=2"
	readV1    = "WAREHOUSE_ORDER_CREATED_VERSIONS=1"
	readBoth  = "WAREHOUSE_ORDER_CREATED_VERSIONS=1,2"
	v2Refusal = "unsupported OrderCreated version 2 (this warehouse reads version 1)"
)

// backlogStep is how long each backlog of the scenario builds: v1 messages in the warehouse's
// queue while it is down, then v1 rows in the orders outbox while the relay is.
const backlogStep = 1500 * time.Millisecond

// contractChangeScenario ships OrderCreated v2 under load twice. (a) The right order, with v1
// messages in the queue and v1 rows pending in the outbox: the warehouse upgraded to read
// both, then the orders API switched to v2, then the relay resumed: nothing dead-lettered.
// The way back (the API to v1, and once every v2 is processed, the warehouse to v1 alone)
// sets up (b) the wrong order: the API switched to v2 against a warehouse that reads v1
// only: every v2 is dead-lettered with its reason and applies nothing; the warehouse
// upgraded, the dead letters replayed with the services' own command (`warehouse
// dead-letters`, dry run first): every order completes once.
func contractChangeScenario() Scenario {
	return Scenario{
		Name: "contract-change",
		Summary: "OrderCreated v2 shipped under load with v1 pending in the outbox and the queue: consumers first (nothing dead-lettered), " +
			"then producers first (v2 dead-lettered with the reason, nothing applied) and the dead letters replayed once fixed: every order completes once",
		Settings: []string{readV1, writeV1}, // the old warehouse, the old orders service
		Inject:   injectContractChange,
		Check:    checks(checkNothingDeadLettered, checkNoDeaths),
		// (b) makes the old warehouse refuse each v2, two warnings each: as many a second as
		// orders come, more when a backlog drains at once on a loaded machine.
		PerMessageWarnings: []string{"OrderCreated refused: dead-lettering it", "message dead-lettered"},
		MinLoad:            20 * time.Second,
		LoadAfterInject:    3 * time.Second,
	}
}

func init() { register(contractChangeScenario()) }

// contractChange is one run's connections and findings.
type contractChange struct {
	e                 *Env
	orders, warehouse *pgx.Conn
}

func injectContractChange(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	c := &contractChange{e: e}
	var err error
	if c.orders, err = openDB(ctx, e.Endpoints.OrdersDB); err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer c.orders.Close(context.WithoutCancel(ctx))
	if c.warehouse, err = openDB(ctx, e.Endpoints.WarehouseDB); err != nil {
		return fmt.Errorf("connect to the warehouse database: %w", err)
	}
	defer c.warehouse.Close(context.WithoutCancel(ctx))
	if err := c.rightOrder(ctx); err != nil {
		return err
	}
	if err := c.wayBack(ctx); err != nil {
		return err
	}
	return c.wrongOrder(ctx)
}

// backlog stops the warehouse, so that v1 messages queue up, then the orders relay, so that
// v1 rows pend in the outbox, and says how many of each there are: the state both orders of
// the switch start from. Both stay stopped.
func (c *contractChange) backlog(ctx context.Context, phase string) error {
	e := c.e
	at := time.Now()
	if err := c.stop(ctx, Warehouse); err != nil {
		return err
	}
	e.Fault(at, "%s the warehouse (reads v1 only) stopped: v1 messages queue up", phase)
	if !sleepCtx(ctx, backlogStep) {
		return ctx.Err()
	}
	if err := c.stop(ctx, OrdersRelay); err != nil {
		return err
	}
	e.Fault(time.Now(), "%s the orders relay stopped: v1 rows pend in the outbox", phase)
	if !sleepCtx(ctx, backlogStep) {
		return ctx.Err()
	}
	// Queued: published and not processed (the warehouse is down). Pending: not published.
	queued, err := c.unprocessed(ctx, 1, true)
	if err != nil {
		return err
	}
	pending, err := c.unprocessed(ctx, 1, false)
	if err != nil {
		return err
	}
	e.Saw("%s at the switch: %d v1 OrderCreated in %s, %d v1 OrderCreated rows pending in the orders outbox",
		phase, queued, warehouseQueue, pending)
	if queued == 0 || pending == 0 {
		e.Fail("%s the switch had no v1 backlog to prove anything with: %d queued, %d pending", phase, queued, pending)
	}
	return nil
}

// rightOrder is (a): consumers first, with a backlog of v1 on both sides of the broker.
func (c *contractChange) rightOrder(ctx context.Context) error {
	e := c.e
	if err := c.backlog(ctx, "(a)"); err != nil {
		return err
	}
	if err := c.start(ctx, Warehouse, readBoth, "(a) consumers first: the warehouse upgraded, reads v1 and v2"); err != nil {
		return err
	}
	if err := c.deploy(ctx, OrdersAPI, writeV2, "(a) then the orders API switched to v2"); err != nil {
		return err
	}
	if err := e.Target.StartService(ctx, OrdersRelay); err != nil {
		return fmt.Errorf("start %s: %w", OrdersRelay, err)
	}
	e.Healed("(a) the orders relay resumed: the v1 backlog, then v2")
	// Every OrderCreated written so far, v1 and v2, processed by the warehouse, v2 among them.
	if err := c.waitWritten(ctx, 2, 10, "(a)"); err != nil {
		return err
	}
	if err := c.waitProcessed(ctx, 0, "(a)", true); err != nil {
		return err
	}
	written, err := c.writtenOrderCreated(ctx)
	if err != nil {
		return err
	}
	dead, err := inspectQueue(ctx, e.Endpoints.AMQPURL, warehouseDeadLetterQueue)
	if err != nil {
		return fmt.Errorf("read %s: %w", warehouseDeadLetterQueue, err)
	}
	e.Saw("(a) outcome: %d v1 and %d v2 OrderCreated processed by the warehouse, %d dead-lettered", written[1], written[2], dead.Messages)
	if dead.Messages != 0 {
		e.Fail("(a) consumers first must dead-letter nothing: %d dead letters", dead.Messages)
	}
	return nil
}

// wayBack rolls the change back in the safe order: producers to v1 first, then, once no v2
// can arrive (every v2 written is processed), the warehouse to v1 alone — the state (b)
// starts from.
func (c *contractChange) wayBack(ctx context.Context) error {
	if err := c.deploy(ctx, OrdersAPI, writeV1, "the way back: the orders API writes v1 again"); err != nil {
		return err
	}
	if err := c.waitProcessed(ctx, 2, "the way back", true); err != nil {
		return err
	}
	return c.deploy(ctx, Warehouse, readV1, "the way back: every v2 processed, the warehouse reads v1 alone again")
}

// wrongOrder is (b): producers first, with the same backlog of v1, then the fix and the
// replay.
func (c *contractChange) wrongOrder(ctx context.Context) error {
	e := c.e
	if err := c.backlog(ctx, "(b)"); err != nil {
		return err
	}
	if err := c.deploy(ctx, OrdersAPI, writeV2, "(b) producers first: the orders API switched to v2"); err != nil {
		return err
	}
	if err := e.Target.StartService(ctx, OrdersRelay); err != nil {
		return fmt.Errorf("start %s: %w", OrdersRelay, err)
	}
	if err := c.start(ctx, Warehouse, readV1, "(b) the orders relay resumed, the old warehouse (reads v1 only) back"); err != nil {
		return err
	}
	// The v1 backlog goes through; v2 after it is refused. Enough of them to prove it.
	if err := c.waitWritten(ctx, 2, 10, "(b)"); err != nil {
		return err
	}
	if err := c.waitProcessed(ctx, 1, "(b)", false); err != nil {
		return err
	}
	if err := c.waitDeadLetters(ctx, 10, "(b)"); err != nil {
		return err
	}
	if err := c.deploy(ctx, Warehouse, readBoth, "(b) the warehouse upgraded: reads v1 and v2"); err != nil {
		return err
	}
	dead, err := peekDeadLetters(ctx, e.Endpoints.AMQPURL, warehouseDeadLetterQueue, 0)
	if err != nil {
		return fmt.Errorf("read %s: %w", warehouseDeadLetterQueue, err)
	}
	ids := make([]string, 0, len(dead))
	reasons := map[string]int{}
	for _, d := range dead {
		ids = append(ids, d.MessageId)
		reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		reasons[reason]++
	}
	var applied int
	if err := c.warehouse.QueryRow(ctx, countProcessed, ids).Scan(&applied); err != nil {
		return fmt.Errorf("count the dead letters the warehouse processed: %w", err)
	}
	e.Saw("(b) outcome: every v1 of the backlog processed; %d v2 OrderCreated dead-lettered to %s, %d of them applied; reasons: %s",
		len(dead), warehouseDeadLetterQueue, applied, formatReasons(reasons))
	want := inboxrabbitmq.ReasonPermanent + ": invalid: " + v2Refusal
	if len(dead) == 0 || reasons[want] != len(dead) || applied != 0 {
		e.Fail("(b) producers first must dead-letter every v2 with %q and apply none: %d dead letters (%s), %d applied",
			want, len(dead), formatReasons(reasons), applied)
	}
	// The runbook's replay: a dry run, then the move.
	dry, err := c.replay(ctx, "--dry-run")
	if err != nil {
		return err
	}
	at := time.Now()
	done, err := c.replay(ctx)
	if err != nil {
		return err
	}
	e.Saw("(b) `warehouse dead-letters --type OrderCreated --version 2`: the dry run matched %d of %d and moved none; the replay moved %d of %d",
		dry.Matched, dry.Examined, done.Replayed, done.Examined)
	if dry.Matched != len(dead) || dry.Replayed != 0 || done.Replayed != len(dead) {
		e.Fail("(b) the replay must move every dead letter once: %d dead, dry run matched %d (moved %d), replay moved %d",
			len(dead), dry.Matched, dry.Replayed, done.Replayed)
	}
	if err := c.waitProcessed(ctx, 2, "(b)", true); err != nil {
		return err
	}
	e.Healed("(b) every replayed v2 processed %.1fs after the replay", time.Since(at).Seconds())
	return nil
}

// start starts svc, stopped, with setting: its deploy.
func (c *contractChange) start(ctx context.Context, svc Service, setting, what string) error {
	at := time.Now()
	if err := c.e.Target.Configure(svc, setting); err != nil {
		return fmt.Errorf("configure %s: %w", svc, err)
	}
	if err := c.e.Target.StartService(ctx, svc); err != nil {
		return fmt.Errorf("start %s with %s: %w", svc, setting, err)
	}
	c.e.Fault(at, "%s (%s, started in %.1fs)", what, setting, time.Since(at).Seconds())
	return nil
}

// deploy restarts svc with setting, as a deploy of a new setting would.
func (c *contractChange) deploy(ctx context.Context, svc Service, setting, what string) error {
	at := time.Now()
	if err := c.e.Target.Configure(svc, setting); err != nil {
		return fmt.Errorf("configure %s: %w", svc, err)
	}
	if err := c.stop(ctx, svc); err != nil {
		return err
	}
	if err := c.e.Target.StartService(ctx, svc); err != nil {
		return fmt.Errorf("start %s with %s: %w", svc, setting, err)
	}
	c.e.Fault(at, "%s (%s, %.1fs)", what, setting, time.Since(at).Seconds())
	return nil
}

// stop stops svc as a deploy does.
func (c *contractChange) stop(ctx context.Context, svc Service) error {
	st, err := c.e.Target.StopService(ctx, svc, restartGrace)
	if err != nil {
		return fmt.Errorf("stop %s: %w", svc, err)
	}
	if !st.Clean() {
		c.e.Fail("%s did not stop cleanly: %s after %s", svc, st.Status, st.Took)
	}
	return nil
}

// replayReport is what `dead-letters --json` prints.
type replayReport struct {
	Queue    string `json:"queue"`
	DryRun   bool   `json:"dry_run"`
	Examined int    `json:"examined"`
	Matched  int    `json:"matched"`
	Replayed int    `json:"replayed"`
	Left     int    `json:"left"`
}

// replay runs the runbook's command in the warehouse's environment.
func (c *contractChange) replay(ctx context.Context, extra ...string) (replayReport, error) {
	args := append([]string{"dead-letters", "--type", "OrderCreated", "--version", "2", "--json"}, extra...)
	out, err := c.e.Target.Exec(ctx, Warehouse, args...)
	if err != nil {
		return replayReport{}, fmt.Errorf("replay the dead letters: %w", err)
	}
	var r replayReport
	if err := json.Unmarshal(out, &r); err != nil {
		return replayReport{}, fmt.Errorf("read the report of warehouse %s: %w: %q", strings.Join(args, " "), err, out)
	}
	return r, nil
}

// Queries of the scenario: the OrderCreated rows of the orders outbox by version, their ids
// (of a version, 0 any; published or not), and which of a list of message ids the
// warehouse's inbox holds.
const (
	writtenOrderCreated = `SELECT (payload->>'version')::int, count(*) FROM outbox_messages
WHERE type = 'OrderCreated' GROUP BY 1`
	orderCreatedIDs = `SELECT id::text FROM outbox_messages
WHERE type = 'OrderCreated' AND ($1 = 0 OR (payload->>'version')::int = $1)
  AND ($2 = 'any' OR (published_at IS NOT NULL) = ($2 = 'published'))`
	countProcessed = `SELECT count(*) FROM inbox_messages WHERE consumer = 'warehouse' AND message_id = ANY($1)`
)

func (c *contractChange) writtenOrderCreated(ctx context.Context) (map[int]int, error) {
	rows, err := c.orders.Query(ctx, writtenOrderCreated)
	if err != nil {
		return nil, fmt.Errorf("count OrderCreated rows by version: %w", err)
	}
	out := map[int]int{}
	var v, n int
	_, err = pgx.ForEachRow(rows, []any{&v, &n}, func() error { out[v] = n; return nil })
	return out, err
}

// ids returns the ids of the OrderCreated rows of version (0: any) that are published
// ("published"), not ("pending") or either ("any").
func (c *contractChange) ids(ctx context.Context, version int, which string) ([]string, error) {
	rows, err := c.orders.Query(ctx, orderCreatedIDs, version, which)
	if err != nil {
		return nil, fmt.Errorf("read the OrderCreated ids: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// processed counts which of ids the warehouse's inbox holds.
func (c *contractChange) processed(ctx context.Context, ids []string) (int, error) {
	var n int
	if err := c.warehouse.QueryRow(ctx, countProcessed, ids).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the OrderCreated the warehouse processed: %w", err)
	}
	return n, nil
}

// unprocessed counts the OrderCreated of version not processed by the warehouse, among those
// published (in the queue, or in flight) or pending in the outbox.
func (c *contractChange) unprocessed(ctx context.Context, version int, published bool) (int, error) {
	which := "pending"
	if published {
		which = "published"
	}
	ids, err := c.ids(ctx, version, which)
	if err != nil {
		return 0, err
	}
	n, err := c.processed(ctx, ids)
	return len(ids) - n, err
}

// waitWritten waits until the orders API wrote at least n OrderCreated of version.
func (c *contractChange) waitWritten(ctx context.Context, version, n int, phase string) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var written map[int]int
	err := poll(wctx, 100*time.Millisecond, func() (bool, error) {
		var err error
		written, err = c.writtenOrderCreated(wctx)
		return err == nil && written[version] >= n, err
	})
	if err != nil {
		return fmt.Errorf("%s: wait for %d OrderCreated v%d to be written (%d so far): %w", phase, n, version, written[version], err)
	}
	return nil
}

// waitProcessed waits until the warehouse processed every OrderCreated of version (0: any)
// written so far. With nothingDead, a dead letter fails it at once, with its reasons.
func (c *contractChange) waitProcessed(ctx context.Context, version int, phase string, nothingDead bool) error {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ids, err := c.ids(wctx, version, "any")
	if err != nil {
		return fmt.Errorf("%s: %w", phase, err)
	}
	n := 0
	err = poll(wctx, 200*time.Millisecond, func() (bool, error) {
		if n, err = c.processed(wctx, ids); err != nil || n == len(ids) {
			return true, err
		}
		if !nothingDead {
			return false, nil
		}
		dead, err := inspectQueue(wctx, c.e.Endpoints.AMQPURL, warehouseDeadLetterQueue)
		if err == nil && dead.Messages > 0 {
			reasons, _ := peekReasons(wctx, c.e.Endpoints.AMQPURL, warehouseDeadLetterQueue, min(dead.Messages, 3))
			return false, fmt.Errorf("%d messages dead-lettered (e.g. %s)", dead.Messages, strings.Join(reasons, "; "))
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %d of %d OrderCreated processed by the warehouse: %w", phase, n, len(ids), err)
	}
	return nil
}

// waitDeadLetters waits until the warehouse's dead-letter queue holds at least n messages.
func (c *contractChange) waitDeadLetters(ctx context.Context, n int, phase string) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	held := 0
	err := poll(wctx, 100*time.Millisecond, func() (bool, error) {
		q, err := inspectQueue(wctx, c.e.Endpoints.AMQPURL, warehouseDeadLetterQueue)
		held = q.Messages
		return err == nil && held >= n, err
	})
	if err != nil {
		return fmt.Errorf("%s: wait for %d dead letters in %s (%d so far): %w", phase, n, warehouseDeadLetterQueue, held, err)
	}
	return nil
}

// formatReasons lists reasons with their counts.
func formatReasons(reasons map[string]int) string {
	var parts []string
	for r, n := range reasons {
		parts = append(parts, fmt.Sprintf("%d × %q", n, r))
	}
	if len(parts) == 0 {
		return "none"
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

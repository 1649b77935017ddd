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

// rightOrder is (a): consumers first, with a backlog of v1 on both sides of the broker.
func (c *contractChange) rightOrder(ctx context.Context) error {
	e := c.e
	at := time.Now()
	if err := c.stop(ctx, Warehouse); err != nil {
		return err
	}
	e.Fault(at, "(a) consumers first: the old warehouse (reads v1) stopped; v1 messages queue up")
	if !sleepCtx(ctx, backlogStep) {
		return ctx.Err()
	}
	if err := c.stop(ctx, OrdersRelay); err != nil {
		return err
	}
	if !sleepCtx(ctx, backlogStep) {
		return ctx.Err()
	}
	queued, err := inspectQueue(ctx, e.Endpoints.AMQPURL, warehouseQueue)
	if err != nil {
		return fmt.Errorf("read %s: %w", warehouseQueue, err)
	}
	pending, err := c.pendingOrderCreated(ctx)
	if err != nil {
		return err
	}
	e.Saw("(a) at the switch: %d v1 messages in %s, %d v1 OrderCreated rows pending in the orders outbox (relay stopped)",
		queued.Messages, warehouseQueue, pending[1])
	if queued.Messages == 0 || pending[1] == 0 {
		e.Fail("(a) the switch had no v1 backlog to prove anything with: %d queued, %d pending", queued.Messages, pending[1])
	}
	// The warehouse is down already: its deploy is a start with the new setting.
	at = time.Now()
	if err := e.Target.Configure(Warehouse, readBoth); err != nil {
		return fmt.Errorf("configure %s: %w", Warehouse, err)
	}
	if err := e.Target.StartService(ctx, Warehouse); err != nil {
		return fmt.Errorf("start %s with %s: %w", Warehouse, readBoth, err)
	}
	e.Fault(at, "(a) the warehouse upgraded: reads v1 and v2 (%s, started in %.1fs)", readBoth, time.Since(at).Seconds())
	if err := c.deploy(ctx, OrdersAPI, writeV2, "(a) the orders API switched to v2"); err != nil {
		return err
	}
	if err := e.Target.StartService(ctx, OrdersRelay); err != nil {
		return fmt.Errorf("start %s: %w", OrdersRelay, err)
	}
	e.Healed("(a) the orders relay resumed: the v1 backlog, then v2")
	if !sleepCtx(ctx, 2*time.Second) {
		return ctx.Err()
	}
	// Everything written so far, v1 and v2, processed by the warehouse.
	if err := c.waitProcessed(ctx, 0, "(a)"); err != nil {
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
	if dead.Messages != 0 || written[2] == 0 {
		e.Fail("(a) consumers first must dead-letter nothing and carry v2: %d dead letters, %d v2 written", dead.Messages, written[2])
	}
	return nil
}

// wayBack rolls the change back in the safe order: producers to v1 first, then, once no v2
// can arrive (every v2 written is processed), the warehouse to v1 alone — which sets up the
// wrong order.
func (c *contractChange) wayBack(ctx context.Context) error {
	if err := c.deploy(ctx, OrdersAPI, writeV1, "the way back: the orders API writes v1 again"); err != nil {
		return err
	}
	if err := c.waitProcessed(ctx, 2, "the way back"); err != nil {
		return err
	}
	return c.deploy(ctx, Warehouse, readV1, "the way back: every v2 processed, the warehouse reads v1 alone again")
}

// wrongOrder is (b): producers first, then the fix and the replay.
func (c *contractChange) wrongOrder(ctx context.Context) error {
	e := c.e
	if err := c.deploy(ctx, OrdersAPI, writeV2, "(b) producers first: the orders API switched to v2 against a warehouse that reads v1"); err != nil {
		return err
	}
	if !sleepCtx(ctx, 3*time.Second) {
		return ctx.Err()
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
	e.Saw("(b) outcome: %d v2 OrderCreated dead-lettered to %s, %d of them applied; reasons: %s",
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
	if err := c.waitProcessed(ctx, 2, "(b)"); err != nil {
		return err
	}
	e.Healed("(b) every replayed v2 processed %.1fs after the replay", time.Since(at).Seconds())
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

// Queries of the scenario: the OrderCreated rows of the orders outbox by version, and which
// of a list of message ids the warehouse's inbox holds.
const (
	pendingOrderCreated = `SELECT (payload->>'version')::int, count(*) FROM outbox_messages
WHERE type = 'OrderCreated' AND published_at IS NULL GROUP BY 1`
	writtenOrderCreated = `SELECT (payload->>'version')::int, count(*) FROM outbox_messages
WHERE type = 'OrderCreated' GROUP BY 1`
	orderCreatedIDs = `SELECT id::text FROM outbox_messages
WHERE type = 'OrderCreated' AND ($1 = 0 OR (payload->>'version')::int = $1)`
	countProcessed = `SELECT count(*) FROM inbox_messages WHERE consumer = 'warehouse' AND message_id = ANY($1)`
)

func (c *contractChange) byVersion(ctx context.Context, query string) (map[int]int, error) {
	rows, err := c.orders.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("count OrderCreated rows by version: %w", err)
	}
	out := map[int]int{}
	var v, n int
	_, err = pgx.ForEachRow(rows, []any{&v, &n}, func() error { out[v] = n; return nil })
	return out, err
}

func (c *contractChange) pendingOrderCreated(ctx context.Context) (map[int]int, error) {
	return c.byVersion(ctx, pendingOrderCreated)
}

func (c *contractChange) writtenOrderCreated(ctx context.Context) (map[int]int, error) {
	return c.byVersion(ctx, writtenOrderCreated)
}

// waitProcessed waits until the warehouse processed every OrderCreated of version (0: any)
// written so far.
func (c *contractChange) waitProcessed(ctx context.Context, version int, phase string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var ids []string
	if err := pgx.BeginFunc(ctx, c.orders, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, orderCreatedIDs, version)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}); err != nil {
		return fmt.Errorf("%s: read the OrderCreated ids: %w", phase, err)
	}
	for {
		var n int
		if err := c.warehouse.QueryRow(ctx, countProcessed, ids).Scan(&n); err != nil {
			return fmt.Errorf("%s: wait for %d OrderCreated to be processed: %w", phase, len(ids), err)
		}
		if n == len(ids) {
			return nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("%s: %d of %d OrderCreated processed by the warehouse after 60s", phase, n, len(ids))
		}
	}
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

package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The scenarios of this file break the shop the way operations do rather than the way
// machines crash: bad rows written by hand, a rolling deploy, a broker that stops reading, a
// relay that stops running without dying, a database away for long. Each passes only when
// the shop's guarantee holds for it, and each fails when a process dies on the way.

func init() {
	register(
		Scenario{
			Name:    "outbox-poison",
			Summary: "bad rows written straight into the orders outbox mid-load (fields over 255 bytes, non-string headers, headers over frame_max, a payload over MaxMessageBytes, an unknown exchange, CC headers): they end dead, every healthy order completes, the relay never calls it an outage",
			Inject:  injectOutboxPoison,
			Check:   checks(checkOutboxPoison, checkNoDeaths),
			// Orders keep coming for a while after the poison, which takes a few seconds
			// to write (16 MiB of it).
			MinLoad: 10 * time.Second,
			// Rows that fail by their own fault are retried at most twice (1s and 2s apart
			// in the orders relay) before they are dead, so the scenario ends quickly even
			// when a kind of poison is taken for a retryable failure.
			Settings: []string{"ORDERS_RELAY_MAX_ATTEMPTS=3"},
		},
		Scenario{
			Name:    "migrate-under-load",
			Summary: "every service process stopped gracefully and started again, one by one, while orders flow: each start runs the migrations next to running relays and writers; no deadlock, nothing lost or applied twice",
			Inject:  injectRollingRestart,
			Check:   checks(checkNoDeadlock, checkNoDeaths),
			MinLoad: 20 * time.Second,
			// Two orders relays, as a deployment that scales them: a relay restarting
			// migrates next to the other one running.
			Replicas: map[Service]int{OrdersRelay: 2},
		},
		Scenario{
			Name:     "broker-alarm",
			Summary:  "a memory alarm on RabbitMQ for 15s mid-load (the broker stops reading from publishers): nothing lost, everything completes once it clears, the relays still stop cleanly",
			Inject:   injectBrokerAlarm,
			Check:    checks(checkRelaysStopCleanly, checkNoDeaths),
			MinLoad:  20 * time.Second,
			Settings: []string{"ORDERS_RELAY_PUBLISH_TIMEOUT=" + alarmPublishTimeout.String()},
		},
		Scenario{
			Name:    "relay-paused",
			Summary: "one of two orders relays SIGSTOPped for 30s with a batch claimed: the other publishes its rows within the bound, orders keep completing, per-aggregate order kept",
			Inject:  injectRelayPaused,
			Check:   checkNoDeaths,
			MinLoad: 34 * time.Second,
			// The claim timeout (by default the publish timeout + 5s) bounds how long a relay
			// may hold a claim (pkg/outbox's documented bound); the scenario needs it well
			// below the pause.
			Settings: []string{
				"ORDERS_RELAY_PUBLISH_TIMEOUT=" + pausedRelayPublishTimeout.String(),
				"ORDERS_RELAY_CLAIM_TIMEOUT=" + pausedRelayClaimTimeout.String(),
			},
			Replicas: map[Service]int{OrdersRelay: 2},
		},
		Scenario{
			Name:    "db-outage-long",
			Summary: "the warehouse's PostgreSQL down for 10s, 25 times the queues' delivery limit × the consumer's retry delay, while orders keep coming: nothing dead-lettered, nothing lost or applied twice",
			Inject:  injectWarehouseDBOutage,
			Check:   checks(checkNothingDeadLettered, checkNoDeaths),
			MinLoad: 14 * time.Second,
			Settings: []string{
				fmt.Sprintf("WAREHOUSE_QUEUE_DELIVERY_LIMIT=%d", outageDeliveryLimit),
				fmt.Sprintf("ORDERS_QUEUE_DELIVERY_LIMIT=%d", outageDeliveryLimit),
				"WAREHOUSE_CONSUMER_RETRY_DELAY=" + outageRetryDelay.String(),
				// Few deliveries in flight, as on a quiet queue: each is tried again and
				// again through the outage, instead of every message once.
				"WAREHOUSE_CONSUMER_PREFETCH=2",
				"WAREHOUSE_CONSUMER_CONCURRENCY=2",
				// Keeps the consumer's backoff short, so that its redeliveries, if it makes
				// any, come often, and it is back soon after the outage.
				"WAREHOUSE_CONSUMER_MAX_RETRY_DELAY=1s",
			},
		},
	)
}

// checks runs several checks in order.
func checks(cs ...func(context.Context, *Env, *Outcome)) func(context.Context, *Env, *Outcome) {
	return func(ctx context.Context, e *Env, o *Outcome) {
		for _, c := range cs {
			c(ctx, e, o)
		}
	}
}

// checkNoDeaths fails the scenario for every process that ended without the runner asking:
// none of these faults may kill a process.
func checkNoDeaths(_ context.Context, e *Env, o *Outcome) {
	for _, d := range e.Target.Deaths() {
		o.Failures = append(o.Failures, fmt.Sprintf("%s incarnation %d %s, %.1fs into the load: no process may die of this fault",
			d.Service, d.Incarnation, d.Cause(), d.At.Sub(e.LoadStart).Seconds()))
	}
}

// openDB connects to one of the shop's databases for a scenario's own queries.
func openDB(ctx context.Context, url string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return pgx.Connect(ctx, url)
}

// ---- outbox-poison ----

// poisonAggregate is the aggregate_type of every poison row: no order shares it, so the
// poison blocks no healthy aggregate, and the audit's "two events of one type" never meets
// it (each row has its own aggregate_id).
const poisonAggregate = "chaos-poison"

// poisonRow is a row the orders outbox must survive. Empty fields get harmless values: the
// events exchange, a routing key of the row's own that only the runner's observer queue
// matches, type ChaosPoison, a small JSON payload, no headers.
type poisonRow struct {
	kind                      string
	exchange, routingKey, typ string
	payload                   []byte
	headers                   map[string]any
}

// amqpShortMax is the longest AMQP short string (exchange, routing key, type, header keys,
// correlation id): 255 bytes.
const amqpShortMax = 255

// poisonRows are the bad rows the scenario writes. Each would make the broker close the
// channel or the connection, or cannot be read as the relay's Message at all.
func poisonRows() []poisonRow {
	bigHeaders := map[string]any{}
	for i := range 300 { // 300 KB of headers: over RabbitMQ's frame_max of 128 KiB
		bigHeaders[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", 1000)
	}
	// A payload over the relay's MaxMessageBytes (16 MiB by default; the orders relay has no
	// setting for it).
	huge := []byte(`{"blob":"` + strings.Repeat("x", 16<<20+1024) + `"}`)
	return []poisonRow{
		{kind: "routing-key-256", routingKey: "chaos.poison." + strings.Repeat("k", amqpShortMax+1-len("chaos.poison."))},
		{kind: "type-256", typ: strings.Repeat("T", amqpShortMax+1)},
		{kind: "exchange-256", exchange: strings.Repeat("x", amqpShortMax+1)},
		{kind: "headers-not-strings", headers: map[string]any{"attempt": 3, "urgent": true, "nested": map[string]any{"a": 1}, "none": nil}},
		{kind: "header-key-300", headers: map[string]any{strings.Repeat("h", 300): "v"}},
		{kind: "correlation-id-256", headers: map[string]any{"correlation_id": strings.Repeat("c", amqpShortMax+1)}},
		{kind: "headers-over-frame-max", headers: bigHeaders},
		{kind: "unknown-exchange", exchange: "chaos.no-such-exchange"},
		{kind: "cc-number", headers: map[string]any{"CC": 42}},
		{kind: "cc-string", headers: map[string]any{"CC": "chaos.poison.cc"}},
		// Last: 16 MiB take seconds to write on a busy machine.
		{kind: "payload-over-max-message-bytes", payload: huge},
	}
}

// insertPoison writes one row straight into the outbox, as code other than outbox.Add (an
// older version, a migration, an operator) could. Payload and headers go as bytes, so the
// statement works whatever type the columns have.
const insertPoison = `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

func (p poisonRow) values() (exchange, routingKey, typ string, payload, headers []byte, err error) {
	exchange = cmp.Or(p.exchange, eventsExchange)
	routingKey = cmp.Or(p.routingKey, "chaos.poison."+p.kind)
	typ = cmp.Or(p.typ, "ChaosPoison")
	payload = p.payload
	if payload == nil {
		payload = []byte(`{"chaos":"poison","kind":"` + p.kind + `"}`)
	}
	h := p.headers
	if h == nil {
		h = map[string]any{}
	}
	headers, err = json.Marshal(h)
	return
}

func injectOutboxPoison(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var written, refused []string
	for _, p := range poisonRows() {
		exchange, routingKey, typ, payload, headers, err := p.values()
		if err != nil {
			return fmt.Errorf("poison row %s: %w", p.kind, err)
		}
		_, err = conn.Exec(ctx, insertPoison, uuid.New(), exchange, routingKey, typ, poisonAggregate, p.kind, payload, headers)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
			// A schema that refuses the row (a CHECK, a type) keeps it out of the outbox
			// altogether: that holds the guarantee too.
			refused = append(refused, fmt.Sprintf("%s (%s)", p.kind, pgErr.Code))
			continue
		}
		if err != nil {
			return fmt.Errorf("write poison row %s: %w", p.kind, err)
		}
		written = append(written, p.kind)
	}
	if len(refused) > 0 {
		e.Saw("the orders database refused %d poison rows: %s", len(refused), strings.Join(refused, ", "))
	}
	if len(written) == 0 {
		return errors.New("the orders database refused every poison row: nothing reached the relay")
	}
	e.ExpectDeadOutboxRows("orders", len(written))
	e.Fault(time.Now(), "%d poison rows written straight into the orders outbox: %s", len(written), strings.Join(written, ", "))
	return nil
}

// poisonOutcome is what became of one poison row.
type poisonOutcome struct {
	kind            string
	dead, published bool
	attempts        int
	lastError       string
}

const readPoison = `
SELECT aggregate_id, dead_at IS NOT NULL, published_at IS NOT NULL, attempts, coalesce(last_error, '')
FROM outbox_messages WHERE aggregate_type = $1 ORDER BY seq`

// healthyDead counts dead rows that are not poison.
const healthyDead = `SELECT count(*) FROM outbox_messages WHERE dead_at IS NOT NULL AND aggregate_type <> $1`

// Relay log lines and metrics the poison and alarm scenarios read.
const (
	logBrokerUnavailable = `"state":"broker_unavailable"`
	metricReconnects     = "outbox_broker_reconnects_total"
)

// checkOutboxPoison requires every poison row dead (and none published), no healthy row
// dead, a relay that never reported the broker unavailable, and no reconnect storm.
func checkOutboxPoison(ctx context.Context, e *Env, o *Outcome) {
	fail := func(format string, args ...any) { o.Failures = append(o.Failures, fmt.Sprintf(format, args...)) }
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		fail("connect to the orders database: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, readPoison, poisonAggregate)
	if err != nil {
		fail("read the poison rows: %v", err)
		return
	}
	outcomes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (poisonOutcome, error) {
		var p poisonOutcome
		err := r.Scan(&p.kind, &p.dead, &p.published, &p.attempts, &p.lastError)
		return p, err
	})
	if err != nil {
		fail("read the poison rows: %v", err)
		return
	}
	var notDead []string
	for _, p := range outcomes {
		reason := p.lastError
		if len(reason) > 100 {
			reason = reason[:100] + "…"
		}
		e.Saw("poison %s: dead=%t published=%t after %d attempts: %s", p.kind, p.dead, p.published, p.attempts, reason)
		switch {
		case p.published:
			fail("poison row %s was published", p.kind)
		case !p.dead:
			notDead = append(notDead, p.kind)
		case p.lastError == "":
			fail("poison row %s is dead without a last_error", p.kind)
		}
	}
	if len(notDead) > 0 {
		fail("%d poison rows are not dead: %s", len(notDead), strings.Join(notDead, ", "))
	}
	var healthy int
	if err := conn.QueryRow(ctx, healthyDead, poisonAggregate).Scan(&healthy); err != nil {
		fail("count the healthy dead rows: %v", err)
	} else if healthy > 0 {
		fail("%d healthy rows of the orders outbox are dead", healthy)
	}

	logs, err := e.Target.Logs(ctx, OrdersRelay)
	if err != nil {
		fail("read the orders relay's log: %v", err)
		return
	}
	if n := countLines(logs, logBrokerUnavailable); n > 0 {
		fail("the orders relay reported broker_unavailable %d times, though the broker was up: poison taken for an outage", n)
	}
	if n, ok := scrapeOnce(ctx, e.Endpoints.Metrics[OrdersRelay], metricReconnects); ok {
		e.Saw("the orders relay reconnected to the broker %.0f times", n)
		// A storm is a reconnect per cycle; a relay may lose at most one connection per
		// bad row (the broker closes the connection on a frame it cannot read).
		if int(n) > len(outcomes) {
			fail("the orders relay reconnected %.0f times for %d poison rows: a reconnect storm", n, len(outcomes))
		}
	}
}

// scrapeOnce reads the sum of a metric family from a /metrics URL.
func scrapeOnce(ctx context.Context, url, name string) (float64, bool) {
	if url == "" {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, false
	}
	return sumMetric(string(b), name)
}

// ---- migrate-under-load ----

// restartGrace is how long a process gets to stop after SIGTERM: its shutdown timeouts
// (3s in a shop) and some.
const restartGrace = 10 * time.Second

// rollingRestartOrder is the order of a rolling deploy: each service's processes one after
// the other, the consumers first (as the shop starts).
var rollingRestartOrder = []Service{Warehouse, OrdersAPI, WarehouseRelay, OrdersRelay, Replica(OrdersRelay, 2)}

// injectRollingRestart deploys the shop again and again while the load runs: each process
// stopped with SIGTERM and started again (which migrates), one at a time, round after round
// until shortly before the load ends. Each start runs the migrations next to a relay in
// the middle of its batches and writers adding rows.
func injectRollingRestart(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 1500*time.Millisecond) {
		return ctx.Err()
	}
	until := e.LoadStart.Add(e.Load - 2*time.Second)
	restarts, slowest := 0, time.Duration(0)
	for round := 1; time.Now().Before(until) || round == 1; round++ {
		for _, svc := range rollingRestartOrder {
			st, err := e.Target.StopService(ctx, svc, restartGrace)
			if err != nil {
				return fmt.Errorf("stop %s: %w", svc, err)
			}
			e.Fault(time.Now(), "round %d: %s stopped on SIGTERM in %.1fs (%s)", round, svc, st.Took.Seconds(), st.Status)
			if !st.Clean() {
				e.Fail("%s did not stop cleanly on SIGTERM: %s after %.1fs (killed: %t)", svc, st.Status, st.Took.Seconds(), st.Killed)
			}
			start := time.Now()
			if err := e.Target.StartService(ctx, svc); err != nil {
				// A start that dies (its migration failed, say) is the scenario's finding, not
				// a fault that did not happen: the supervisor starts it again meanwhile.
				e.Fail("%s failed to start again in round %d: %v", svc, round, err)
				if err := waitBack(ctx, e, svc, 30*time.Second); err != nil {
					e.Fail("%s never came back: %v", svc, err)
					return nil // the verifier says what that cost
				}
			}
			restarts++
			slowest = max(slowest, time.Since(start))
			if !sleepCtx(ctx, 300*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	e.Healed("%d restarts, every process back, migrated and ready (the slowest in %.1fs)", restarts, slowest.Seconds())
	return nil
}

// waitBack waits until svc, which the supervisor restarts after each death, is ready, or
// for at most d.
func waitBack(ctx context.Context, e *Env, svc Service, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		err := e.Target.Heal(ctx, svc)
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
}

// logDeadlock is PostgreSQL's message for a deadlock, in its own log and in the error a
// client gets.
const logDeadlock = "deadlock detected"

// checkNoDeadlock requires that no service and no database server logged a deadlock.
func checkNoDeadlock(ctx context.Context, e *Env, o *Outcome) {
	found := map[string]int{}
	for _, svc := range rollingRestartOrder {
		if logs, err := e.Target.Logs(ctx, svc); err == nil {
			if n := countLines(logs, logDeadlock); n > 0 {
				found[string(svc)] = n
			}
		}
	}
	for _, c := range []Component{OrdersDB, WarehouseDB} {
		logs, err := e.Target.ComponentLogs(ctx, c)
		if err != nil {
			e.Saw("%s's log not read: %v", c, err)
			continue
		}
		if n := countLines(logs, logDeadlock); n > 0 {
			found[string(c)] = n
		}
	}
	if len(found) == 0 {
		e.Saw("no %q in any service's log nor in either PostgreSQL's", logDeadlock)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(found)) {
		o.Failures = append(o.Failures, fmt.Sprintf("%q in the log of %s (%d lines): migrations and the running relays or writers deadlocked", logDeadlock, k, found[k]))
	}
}

// ---- broker-alarm ----

const alarmFor = 15 * time.Second

func injectBrokerAlarm(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, time.Second) {
		return ctx.Err()
	}
	// The alarm takes effect while rabbitmqctl runs (a second or more on two cores):
	// between requested and raised.
	requested := time.Now()
	if err := e.Target.BrokerAlarm(ctx, true); err != nil {
		return fmt.Errorf("raise the memory alarm: %w", err)
	}
	raised := time.Now()
	clear := func(ctx context.Context) error { return e.Target.BrokerAlarm(ctx, false) }
	alarms, err := e.Target.BrokerAlarms(ctx)
	if err != nil {
		_ = clear(context.WithoutCancel(ctx))
		return fmt.Errorf("read the broker's alarms: %w", err)
	}
	if !strings.Contains(alarms, "memory") {
		_ = clear(context.WithoutCancel(ctx))
		return fmt.Errorf("the watermark is 0 but the broker lists no memory alarm: %s", alarms)
	}
	e.Fault(raised, "memory alarm raised on RabbitMQ (set_vm_memory_high_watermark 0); its alarms: %s", alarms)
	cpu := e.outageStarts(ctx, "the broker's memory alarm was raised")
	if !sleepCtx(ctx, time.Until(raised.Add(alarmFor))) {
		// Clear it anyway: the broker serves the scenarios after this one.
		_ = clear(context.WithoutCancel(ctx))
		return ctx.Err()
	}
	clearing := time.Now()
	if err := clear(ctx); err != nil {
		return fmt.Errorf("clear the memory alarm: %w", err)
	}
	cleared := time.Now()
	e.outageEnds(ctx, cpu)
	alarms, err = e.Target.BrokerAlarms(ctx)
	if err != nil {
		return fmt.Errorf("read the broker's alarms: %w", err)
	}
	e.Healed("memory alarm cleared after %.1fs (watermark set back); its alarms: %s", cleared.Sub(raised).Seconds(), alarms)
	if strings.Contains(alarms, "memory") {
		return fmt.Errorf("the watermark is set back but the broker still lists a memory alarm: %s", alarms)
	}

	// What the alarm did: the warehouse's answers reach the orders only through the relays.
	if conn, err := openDB(ctx, e.Endpoints.OrdersDB); err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		if times, err := completionTimes(ctx, conn); err == nil {
			during := 0
			for _, t := range times {
				if t.After(raised.Add(time.Second)) && t.Before(clearing) {
					during++
				}
			}
			e.Saw("%d orders got the warehouse's answer from 1s into the alarm until it was cleared", during)
		}
	}
	for _, svc := range []Service{OrdersRelay, WarehouseRelay} {
		if logs, err := e.Target.Logs(ctx, svc); err == nil {
			e.Saw("%s reported broker_unavailable %d times", svc, countLines(logs, logBrokerUnavailable))
		}
	}
	checkAlarmNoticed(ctx, e, requested, raised)
	return nil
}

// alarmPublishTimeout is the orders relay's publish timeout in broker-alarm: well within
// the alarm, so that the relay must notice it.
const alarmPublishTimeout = 5 * time.Second

// checkAlarmNoticed requires that the orders relay, which has rows to publish all through
// the alarm (the orders API keeps taking orders), reported the broker unavailable within its
// publish timeout and a margin: a publish to a broker that stopped reading must not block a
// cycle beyond it. It is checked only when the orders service reads its publish timeout
// from the environment; with the default of 30s the alarm would be over first. The alarm
// began between requested and raised (rabbitmqctl's call and its return).
func checkAlarmNoticed(ctx context.Context, e *Env, requested, raised time.Time) {
	setting := "ORDERS_RELAY_PUBLISH_TIMEOUT=" + alarmPublishTimeout.String()
	if len(unreadSettings([]string{setting})) > 0 {
		e.Saw("not checked whether the orders relay noticed the alarm: the orders service has no ORDERS_RELAY_PUBLISH_TIMEOUT")
		return
	}
	logs, err := e.Target.Logs(ctx, OrdersRelay)
	if err != nil {
		e.Fail("read the orders relay's log: %v", err)
		return
	}
	bound := alarmPublishTimeout + 2*time.Second
	at, ok := firstLogAfter(logs, logBrokerUnavailable, requested)
	switch {
	case !ok:
		e.Fail("the orders relay never reported broker_unavailable during the alarm (publish timeout %s)", alarmPublishTimeout)
	case at.Sub(raised) > bound:
		e.Fail("the orders relay reported broker_unavailable %.1fs into the alarm, over its publish timeout %s and a margin (%s)",
			at.Sub(raised).Seconds(), alarmPublishTimeout, bound)
	default:
		e.Saw("the orders relay reported broker_unavailable %.1fs after the alarm was asked for (rabbitmqctl returned after %.1fs)",
			at.Sub(requested).Seconds(), raised.Sub(requested).Seconds())
	}
}

// firstLogAfter returns the time of the first JSON log line containing s that was written
// after after.
func firstLogAfter(logs, s string, after time.Time) (time.Time, bool) {
	for line := range strings.Lines(logs) {
		if !strings.Contains(line, s) {
			continue
		}
		var entry struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Time.After(after) {
			return entry.Time, true
		}
	}
	return time.Time{}, false
}

// checkRelaysStopCleanly stops both relays as a deploy would and requires that each exits
// by itself on SIGTERM: a relay stuck in a write to a broker that stopped reading would not.
func checkRelaysStopCleanly(ctx context.Context, e *Env, o *Outcome) {
	for _, svc := range []Service{OrdersRelay, WarehouseRelay} {
		st, err := e.Target.StopService(ctx, svc, restartGrace)
		if err != nil {
			o.Failures = append(o.Failures, fmt.Sprintf("stop %s: %v", svc, err))
			continue
		}
		e.Saw("%s stopped on SIGTERM in %.1fs (%s)", svc, st.Took.Seconds(), st.Status)
		if !st.Clean() {
			o.Failures = append(o.Failures, fmt.Sprintf("%s did not stop cleanly on SIGTERM after the alarm: %s after %.1fs (killed: %t)",
				svc, st.Status, st.Took.Seconds(), st.Killed))
		}
	}
}

// ---- relay-paused ----

const (
	// pausedRelayFor is how long the relay stays stopped.
	pausedRelayFor = 30 * time.Second
	// pausedRelayPublishTimeout and pausedRelayClaimTimeout are the orders relays' publish
	// and claim timeouts in the scenario: a relay stopped mid-batch loses its claim after
	// the claim timeout (pkg/outbox: Config.ClaimTimeout).
	pausedRelayPublishTimeout = 5 * time.Second
	pausedRelayClaimTimeout   = 10 * time.Second
	// pausedRelayBound is how soon after the pause the rows the paused relay held must be
	// published by the other: the claim timeout and a margin for the other relay's cycles,
	// well within the pause.
	pausedRelayBound = 2 * pausedRelayClaimTimeout
	// completionStallBound is the longest the shop may go without completing an order while
	// one relay is paused and orders keep coming.
	completionStallBound = 5 * time.Second
)

// pausedRelay is the relay the scenario stops: the second one, so that the first keeps the
// name the other scenarios use.
var pausedRelay = Replica(OrdersRelay, 2)

// inTransaction tells whether a session of application is between its claim and the end of
// the claim's transaction: idle in a transaction whose last statement was the claim (FOR
// UPDATE … SKIP LOCKED), that is, publishing the batch it claimed. Any transaction of the
// relay would not do: at the scenario's load most claims find nothing (the other relay took
// the rows) and end at once, and the maintenance passes hold no batch, so a stop caught in
// those fell between batches again and again (a run gave up after 12 tries).
const inTransaction = `
SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND xact_start IS NOT NULL AND state = 'idle in transaction'
  AND query LIKE '%FOR UPDATE OF % SKIP LOCKED%'`

// heldRows are the pending rows created before $1 that are still pending: with one relay
// running freely, only rows the other holds stay pending for long.
const heldRows = `
SELECT id::text FROM outbox_messages
WHERE published_at IS NULL AND dead_at IS NULL AND created_at < $1 ORDER BY seq`

// heldRowsPublished reads when rows were published.
const heldRowsPublished = `
SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FILTER (WHERE dead_at IS NOT NULL), max(published_at)
FROM outbox_messages WHERE id = ANY($1::uuid[])`

func injectRelayPaused(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	pausedAt, held, tries, err := pauseHoldingRows(ctx, e, conn)
	if err != nil {
		return err
	}
	e.Fault(pausedAt, "%s SIGSTOPped holding %d rows (caught on try %d), for %s", pausedRelay, len(held), tries, pausedRelayFor)

	// Watch the held rows while the relay is stopped: the other relay must publish them.
	var released time.Time
	for time.Since(pausedAt) < pausedRelayFor {
		if released.IsZero() {
			var published, dead int
			var last *time.Time
			if err := conn.QueryRow(ctx, heldRowsPublished, held).Scan(&published, &dead, &last); err == nil &&
				published+dead == len(held) {
				released = time.Now()
				if last != nil {
					released = *last
				}
				e.Saw("the %d rows %s held were published by the other relay %.1fs after the pause (%d dead)",
					len(held), pausedRelay, released.Sub(pausedAt).Seconds(), dead)
			}
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			_ = e.Target.Resume(context.WithoutCancel(ctx), pausedRelay)
			return ctx.Err()
		}
	}
	if err := e.Target.Resume(ctx, pausedRelay); err != nil {
		return fmt.Errorf("resume %s: %w", pausedRelay, err)
	}
	resumedAt := time.Now()
	e.Healed("%s resumed (SIGCONT) after %.1fs", pausedRelay, resumedAt.Sub(pausedAt).Seconds())

	switch {
	case released.IsZero():
		e.Fail("the %d rows %s held were still unpublished when it resumed %s later: a paused relay holds its rows without bound",
			len(held), pausedRelay, pausedRelayFor)
	case released.Sub(pausedAt) > pausedRelayBound:
		e.Fail("the %d rows %s held were published %.1fs after the pause, over the bound of %s",
			len(held), pausedRelay, released.Sub(pausedAt).Seconds(), pausedRelayBound)
	}

	// Orders kept completing while the relay was stopped: measured over the part of the
	// pause when orders were still being placed.
	end := resumedAt
	if loadEnd := e.LoadStart.Add(e.Load); loadEnd.Before(end) {
		end = loadEnd
	}
	times, err := completionTimes(ctx, conn)
	if err != nil {
		return fmt.Errorf("read the completions: %w", err)
	}
	stall, at := longestStall(times, pausedAt, end)
	e.Saw("longest stall of completions while %s was stopped: %.1fs (from %.1fs into the load)", pausedRelay, stall.Seconds(), at.Sub(e.LoadStart).Seconds())
	if stall > completionStallBound {
		e.Fail("no order completed for %.1fs while %s was stopped (bound %s): the other relay stalled", stall.Seconds(), pausedRelay, completionStallBound)
	}
	return nil
}

// pauseHoldingRows stops the paused relay in the middle of a batch: it waits (up to a second)
// for a session of it to be between its claim and the claim's commit (inTransaction) and
// sends SIGSTOP; if, a moment later, no row
// older than the stop is still pending — the stop fell between two batches — it lets the
// relay go on and tries again. It returns when the relay was stopped, the rows it holds,
// and the number of tries.
func pauseHoldingRows(ctx context.Context, e *Env, conn *pgx.Conn) (time.Time, []string, int, error) {
	deadline := time.Now().Add(20 * time.Second)
	for try := 1; ; try++ {
		// Catch it in a transaction if its sessions can be told apart (application_name);
		// otherwise stop it at a random moment.
		watch := time.Now().Add(time.Second)
		for time.Now().Before(watch) {
			var n int
			if err := conn.QueryRow(ctx, inTransaction, string(pausedRelay)).Scan(&n); err != nil {
				return time.Time{}, nil, try, fmt.Errorf("read pg_stat_activity: %w", err)
			}
			if n > 0 {
				break
			}
		}
		if err := e.Target.Pause(ctx, pausedRelay); err != nil {
			return time.Time{}, nil, try, fmt.Errorf("pause %s: %w", pausedRelay, err)
		}
		pausedAt := time.Now()
		if !sleepCtx(ctx, 700*time.Millisecond) {
			_ = e.Target.Resume(context.WithoutCancel(ctx), pausedRelay)
			return time.Time{}, nil, try, ctx.Err()
		}
		rows, err := conn.Query(ctx, heldRows, pausedAt)
		var held []string
		if err == nil {
			held, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			_ = e.Target.Resume(context.WithoutCancel(ctx), pausedRelay)
			return time.Time{}, nil, try, fmt.Errorf("read the held rows: %w", err)
		}
		if len(held) > 0 {
			return pausedAt, held, try, nil
		}
		if err := e.Target.Resume(ctx, pausedRelay); err != nil {
			return time.Time{}, nil, try, fmt.Errorf("resume %s: %w", pausedRelay, err)
		}
		if time.Now().After(deadline) {
			return time.Time{}, nil, try, fmt.Errorf("%s never held a row when stopped, in %d tries", pausedRelay, try)
		}
		if !sleepCtx(ctx, time.Duration(50+rand.IntN(200))*time.Millisecond) {
			return time.Time{}, nil, try, ctx.Err()
		}
	}
}

// completions are the times the orders got the warehouse's first answer: the first status
// change caused by a consumed message.
const completions = `
SELECT min(at) FROM order_status_history WHERE message_id IS NOT NULL GROUP BY order_id`

func completionTimes(ctx context.Context, conn querier) ([]time.Time, error) {
	rows, err := conn.Query(ctx, completions)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[time.Time])
}

// querier is a connection or a pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// longestStall is the longest interval within [from, to] without any of times, and where
// it began.
func longestStall(times []time.Time, from, to time.Time) (time.Duration, time.Time) {
	in := make([]time.Time, 0, len(times))
	for _, t := range times {
		if !t.Before(from) && !t.After(to) {
			in = append(in, t)
		}
	}
	slices.SortFunc(in, func(a, b time.Time) int { return a.Compare(b) })
	longest, at, prev := time.Duration(0), from, from
	for _, t := range append(in, to) {
		if gap := t.Sub(prev); gap > longest {
			longest, at = gap, prev
		}
		prev = t
	}
	return longest, at
}

// ---- db-outage-long ----

const (
	// outageDeliveryLimit and outageRetryDelay are the queues' x-delivery-limit and the
	// consumer's retry delay in the scenario; the outage lasts 25 times their product.
	outageDeliveryLimit = 2
	outageRetryDelay    = 200 * time.Millisecond
	outageFor           = 10 * time.Second
)

// deadLetterQueues are the shop's dead-letter queues (docs/events.md).
var deadLetterQueues = []string{warehouseDeadLetterQueue, "orders.stock.dead"}

func injectWarehouseDBOutage(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	if err := e.Target.Kill(ctx, WarehouseDB); err != nil {
		return fmt.Errorf("kill the warehouse database: %w", err)
	}
	killedAt := time.Now()
	e.Fault(killedAt, "warehouse PostgreSQL SIGKILLed for %s (delivery limit %d × retry delay %s = %s)",
		outageFor, outageDeliveryLimit, outageRetryDelay, time.Duration(outageDeliveryLimit)*outageRetryDelay)
	cpu := e.outageStarts(ctx, "the warehouse database was down")
	if !sleepCtx(ctx, time.Until(killedAt.Add(outageFor))) {
		_ = e.Target.Restart(context.WithoutCancel(ctx), WarehouseDB)
		return ctx.Err()
	}
	// Orders kept coming: their events wait in the warehouse's queue.
	if q, err := inspectQueue(ctx, e.Endpoints.AMQPURL, "warehouse.orders"); err == nil {
		e.Saw("warehouse.orders held %d ready messages at the end of the outage", q.Messages)
	}
	if err := e.Target.Restart(ctx, WarehouseDB); err != nil {
		return fmt.Errorf("restart the warehouse database: %w", err)
	}
	e.outageEnds(ctx, cpu)
	e.Healed("warehouse PostgreSQL restarted after %.1fs (crash recovery)", time.Since(killedAt).Seconds())
	return nil
}

// checkNothingDeadLettered requires both dead-letter queues empty at the end: an outage is
// nobody's message's fault, and what a scenario dead-letters on purpose it replays.
func checkNothingDeadLettered(ctx context.Context, e *Env, o *Outcome) {
	total := 0
	for _, q := range deadLetterQueues {
		info, err := inspectQueue(ctx, e.Endpoints.AMQPURL, q)
		if err != nil {
			o.Failures = append(o.Failures, fmt.Sprintf("read %s: %v", q, err))
			continue
		}
		total += info.Messages
		if info.Messages == 0 {
			continue
		}
		reasons, _ := peekReasons(ctx, e.Endpoints.AMQPURL, q, min(info.Messages, 5))
		o.Failures = append(o.Failures, fmt.Sprintf("%d messages left dead-lettered in %s (e.g. %s)",
			info.Messages, q, strings.Join(reasons, "; ")))
	}
	e.Saw("%d messages in the dead-letter queues (%s)", total, strings.Join(deadLetterQueues, ", "))
}

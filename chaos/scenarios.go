package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
)

// The crash points, under the names the libraries and the orders API give them.
const (
	pointRelayBeforePublish   = outbox.FailpointBeforePublish
	pointRelayAfterPublish    = outbox.FailpointAfterPublish
	pointRelayAfterMark       = outbox.FailpointAfterMark
	pointConsumerBeforeCommit = inboxrabbitmq.FailpointBeforeCommit
	pointConsumerAfterCommit  = inboxrabbitmq.FailpointAfterCommit
	pointAPIAfterCommit       = ordersapp.FailpointAfterCommit
)

// Names of docs/events.md and the services' log messages the runner reads.
const (
	eventsExchange           = "shop.events"
	routingKeyOrderCreated   = "order.created"
	warehouseQueue           = "warehouse.orders"
	warehouseDeadLetterQueue = "warehouse.orders.dead"
	logDuplicateSkipped      = `"msg":"duplicate message skipped"`
	logOrderCreated          = `"msg":"order created"`
)

func init() {
	register(
		crashScenario("relay-before-publish", OrdersRelay, pointRelayBeforePublish,
			"orders relay killed with a batch claimed, nothing sent: the rows stay pending and the restarted relay publishes them",
			nil),
		crashScenario("relay-after-publish", OrdersRelay, pointRelayAfterPublish,
			"orders relay killed after the broker confirmed a batch, before marking it: the batch is published again and the warehouse inbox absorbs it",
			expectDuplicates(true)),
		crashScenario("relay-after-mark", OrdersRelay, pointRelayAfterMark,
			"orders relay killed after marking a batch, before commit: the marks roll back, the batch is published again and absorbed",
			expectDuplicates(true)),
		crashScenario("consumer-before-commit", Warehouse, pointConsumerBeforeCommit,
			"warehouse consumer killed with a reservation written, not committed: it rolls back and the redelivery applies it once",
			nil),
		crashScenario("consumer-after-commit", Warehouse, pointConsumerAfterCommit,
			"warehouse consumer killed after commit, before the ack: the broker redelivers and the inbox skips the redelivery",
			expectDuplicates(false)),
		withSettings(crashScenario("consumer-mid-batch", Warehouse, pointConsumerBeforeCommit,
			"warehouse consumer in batches of 8 killed mid-batch, reservations written for part of it: the batch rolls back whole and the redeliveries apply each order once",
			nil), batchSettings...),
		Scenario{
			Name:    "broker-kill",
			Summary: "RabbitMQ SIGKILLed mid-load and restarted: durable quorum queues and persistent messages survive, everyone reconnects",
			Inject:  injectBrokerKill,
		},
		Scenario{
			Name:    "network",
			Summary: "the network between the services and RabbitMQ cut for 3s, then every chunk delayed by 200ms for 3s",
			Inject:  injectNetwork,
		},
		Scenario{
			Name:    "orders-db-kill",
			Summary: "the orders PostgreSQL SIGKILLed mid-load and restarted: the API answers 503 meanwhile, every 201 survives, retries create nothing twice",
			Inject:  injectOrdersDBKill,
			Check:   checkNoOrphans,
		},
		Scenario{
			Name:    "poison",
			Summary: "a malformed OrderCreated (bad JSON) and one of version 99 published to the events exchange: both dead-lettered, the rest flows",
			Inject:  injectPoison,
			Check:   checkPoison,
		},
		crashScenario("api-after-commit", OrdersAPI, pointAPIAfterCommit,
			"orders API killed after an order committed, before the answer: the client retries with its key and gets the original order",
			checkAPIAfterCommit),
	)
}

// hits is the N of kill@N for a crash point reached about once per order: about seconds into
// a load of rate orders per second.
func hits(rate, seconds float64) int { return max(3, int(rate*seconds)) }

// crashScenario arms a crash point in svc, waits for the process to die there, and lets the
// supervisor bring it back without it.
// batchSettings run the warehouse's consumer in batches of 8, four at once (its prefetch
// of 32), where it runs a transaction per order by default; each batch waits up to 200ms to
// fill, so that at the scenarios' load (40 orders/s) its batches hold several orders.
var batchSettings = []string{"WAREHOUSE_CONSUMER_BATCH_SIZE=8", "WAREHOUSE_CONSUMER_CONCURRENCY=4", "WAREHOUSE_CONSUMER_BATCH_WAIT=200ms"}

// withSettings returns s with settings added to its own.
func withSettings(s Scenario, settings ...string) Scenario {
	s.Settings = append(append([]string(nil), s.Settings...), settings...)
	return s
}

func crashScenario(name string, svc Service, point, summary string, check func(context.Context, *Env, *Outcome)) Scenario {
	// A relay reaches its points once per batch, which holds several rows when the relay
	// falls behind (a loaded machine): arm it earlier, so that it fires well within the load.
	seconds := 1.5
	if strings.HasPrefix(point, "relay.") {
		seconds = 0.75
	}
	return Scenario{
		Name:    name,
		Summary: summary,
		Failpoints: func(rate float64) map[Service]string {
			return map[Service]string{svc: fmt.Sprintf("%s=kill@%d", point, hits(rate, seconds))}
		},
		Inject: func(ctx context.Context, e *Env) error { return crashedAndHealed(ctx, e, svc, point, "") },
		Check:  check,
	}
}

// crashedAndHealed waits until svc dies at its crash point point (at most 20s past the
// load), reports it (where says where it was, if anything), and heals it.
func crashedAndHealed(ctx context.Context, e *Env, svc Service, point, where string) error {
	wctx, cancel := context.WithDeadline(ctx, e.LoadStart.Add(e.Load+20*time.Second))
	defer cancel()
	d, err := e.Target.WaitDeath(wctx, svc)
	if err != nil {
		return fmt.Errorf("%s never died at its crash point %s%s: %w", svc, point, where, err)
	}
	if !d.Killed {
		return fmt.Errorf("%s ended (%s), but not by the SIGKILL of its crash point %s", svc, d.Status, point)
	}
	e.Fault(d.At, "%s killed by its crash point %s%s (%s)", svc, point, where, d.Status)
	if err := e.Target.Heal(ctx, svc); err != nil {
		return fmt.Errorf("heal %s: %w", svc, err)
	}
	e.Healed("%s restarted without crash points and ready", svc)
	return nil
}

// expectDuplicates requires the duplicates the crash point promises: published twice by the
// relay (when published is set) and absorbed by an inbox.
func expectDuplicates(published bool) func(context.Context, *Env, *Outcome) {
	return func(_ context.Context, _ *Env, o *Outcome) {
		if published && o.DuplicatesPublished == 0 {
			o.Failures = append(o.Failures, "no event was published twice, though the relay died between the broker's confirm and its commit")
		}
		if o.DuplicatesAbsorbed == 0 {
			o.Failures = append(o.Failures, "no inbox absorbed a duplicate, though the crash point promises one")
		}
	}
}

func injectBrokerKill(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	if err := e.Target.Kill(ctx, Broker); err != nil {
		return fmt.Errorf("kill the broker: %w", err)
	}
	e.Fault(time.Now(), "RabbitMQ SIGKILLed; its AMQP port is closed")
	cpu := e.outageStarts(ctx, "the broker was down")
	if !sleepCtx(ctx, 2*time.Second) {
		return ctx.Err()
	}
	start := time.Now()
	if err := e.Target.Restart(ctx, Broker); err != nil {
		return fmt.Errorf("restart the broker: %w", err)
	}
	e.outageEnds(ctx, cpu)
	e.Healed("RabbitMQ restarted on its data directory, answering after %.1fs", time.Since(start).Seconds())
	return nil
}

func injectNetwork(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 1500*time.Millisecond) {
		return ctx.Err()
	}
	if err := e.Target.CutNetwork(ctx); err != nil {
		return fmt.Errorf("cut the network: %w", err)
	}
	e.Fault(time.Now(), "network to RabbitMQ cut: every connection dropped, new ones refused")
	cpu := e.outageStarts(ctx, "the network to the broker was cut")
	if !sleepCtx(ctx, 3*time.Second) {
		return ctx.Err()
	}
	cut := e.Target.NetworkStats()
	if err := e.Target.HealNetwork(ctx); err != nil {
		return fmt.Errorf("heal the network: %w", err)
	}
	e.outageEnds(ctx, cpu)
	e.Healed("network restored after 3s (%d connections dropped, %d refused meanwhile)", cut.Cut, cut.Refused)
	if cut.Cut == 0 {
		return fmt.Errorf("the cut dropped no connection: the services do not reach the broker through the proxy")
	}
	if !sleepCtx(ctx, time.Second) {
		return ctx.Err()
	}
	const delay = 200 * time.Millisecond
	if err := e.Target.DelayNetwork(ctx, delay); err != nil {
		return fmt.Errorf("delay the network: %w", err)
	}
	e.Fault(time.Now(), "network to RabbitMQ delayed: %s added to every chunk", delay)
	if !sleepCtx(ctx, 3*time.Second) {
		return ctx.Err()
	}
	if err := e.Target.HealNetwork(ctx); err != nil {
		return fmt.Errorf("heal the network: %w", err)
	}
	delayed := e.Target.NetworkStats().Delayed
	e.Healed("delay removed after 3s (%d chunks held back)", delayed)
	if delayed == 0 {
		return fmt.Errorf("the delay held back no chunk")
	}
	return nil
}

func injectOrdersDBKill(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	if err := e.Target.Kill(ctx, OrdersDB); err != nil {
		return fmt.Errorf("kill the orders database: %w", err)
	}
	killedAt := time.Now()
	e.Fault(killedAt, "orders PostgreSQL SIGKILLed (postmaster and backends)")
	cpu := e.outageStarts(ctx, "the orders database was down")

	// Sample the API while the database is down: it must say 503, not hang or 500.
	codes := map[int]int{}
	sample := func() (get, post int) {
		get = probeStatus(ctx, http.MethodGet, e.Endpoints.OrdersURL+"/orders/"+e.Probe.ID, "", nil)
		post = probeStatus(ctx, http.MethodPost, e.Endpoints.OrdersURL+"/orders", e.Probe.Key, e.Probe.Body)
		codes[get]++
		codes[post]++
		return get, post
	}
	for time.Since(killedAt) < 3*time.Second {
		sample()
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	if err := e.Target.Restart(ctx, OrdersDB); err != nil {
		return fmt.Errorf("restart the orders database: %w", err)
	}
	e.outageEnds(ctx, cpu)
	e.Healed("orders PostgreSQL restarted after %.1fs (crash recovery)", time.Since(killedAt).Seconds())
	// The API recovers by itself: its pool reconnects.
	back := time.Now()
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		get, post := sample()
		return get == http.StatusOK && post == http.StatusCreated, nil
	})
	if err != nil {
		return err
	}
	e.Saw("API answers again %.1fs after the restart; the probe's retry with its key is a replay", time.Since(back).Seconds())
	e.Saw("API answers sampled while the database was down and after: %s", formatCodes(codes))
	if codes[http.StatusServiceUnavailable] == 0 {
		return fmt.Errorf("the API never answered 503 while its database was down (answers: %s)", formatCodes(codes))
	}
	return nil
}

// probeStatus sends one request and returns its status code, 0 for no answer.
func probeStatus(ctx context.Context, method, url, key string, body []byte) int {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	return resp.StatusCode
}

func formatCodes(codes map[int]int) string {
	var keys []int
	for k := range codes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		name := fmt.Sprint(k)
		if k == 0 {
			name = "no answer"
		}
		parts = append(parts, fmt.Sprintf("%s×%d", name, codes[k]))
	}
	return strings.Join(parts, ", ")
}

// checkNoOrphans requires that every order in the database was acknowledged to its client:
// a client that retried with its key got the order its first attempt created.
func checkNoOrphans(_ context.Context, e *Env, o *Outcome) {
	if e.Audit.Orphans > 0 {
		o.Failures = append(o.Failures, plural(e.Audit.Orphans, "order exists", "orders exist")+" that no client was told about")
	}
}

// poisonMessages are the malformed events the poison scenario publishes.
func poisonMessages() []amqp.Publishing {
	now := time.Now().UTC()
	v99, _ := json.Marshal(map[string]any{
		"version": 99, "order_id": uuid.NewString(), "customer_id": "chaos-poison",
		"items": []map[string]any{{"sku": "BOOK-1", "quantity": 1}}, "created_at": now,
	})
	return []amqp.Publishing{
		{
			MessageId: "chaos-poison-bad-json", Type: "OrderCreated", ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Timestamp: now, Body: []byte(`{"version": 1, "order_id": "`),
		},
		{
			MessageId: "chaos-poison-version-99", Type: "OrderCreated", ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Timestamp: now, Body: v99,
		},
	}
}

func injectPoison(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	msgs := poisonMessages()
	if err := publishConfirmed(ctx, e.Endpoints.AMQPURL, eventsExchange, routingKeyOrderCreated, msgs); err != nil {
		return fmt.Errorf("publish the poison messages: %w", err)
	}
	e.Fault(time.Now(), "published to %s with %s, confirmed: %d malformed OrderCreated (bad JSON; version 99)",
		eventsExchange, routingKeyOrderCreated, len(msgs))
	return nil
}

// publishConfirmed publishes msgs as mandatory messages and waits for the broker's confirms.
func publishConfirmed(ctx context.Context, url, exchange, key string, msgs []amqp.Publishing) error {
	conn, err := dialAMQP(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, m)
		if err != nil {
			return err
		}
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("message %s nacked by the broker", m.MessageId)
		}
		select {
		case r := <-returns:
			return fmt.Errorf("message %s unroutable: %s", r.MessageId, r.ReplyText)
		default:
		}
	}
	return nil
}

// checkPoison requires both poison messages in the warehouse's dead-letter queue, each
// with the consumer's reason.
func checkPoison(ctx context.Context, e *Env, o *Outcome) {
	want := len(poisonMessages())
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var depth int
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		q, err := inspectQueue(ctx, e.Endpoints.AMQPURL, warehouseDeadLetterQueue)
		if err != nil {
			return false, nil
		}
		depth = q.Messages
		return depth >= want, nil
	})
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("%s holds %d messages, want the %d poison messages", warehouseDeadLetterQueue, depth, want))
		return
	}
	reasons, err := peekReasons(ctx, e.Endpoints.AMQPURL, warehouseDeadLetterQueue, depth)
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("read %s: %v", warehouseDeadLetterQueue, err))
		return
	}
	e.Saw("%s holds %d messages (depth read on the broker): %s", warehouseDeadLetterQueue, depth, strings.Join(reasons, "; "))
	if depth != want {
		o.Failures = append(o.Failures, fmt.Sprintf("%s holds %d messages, want exactly the %d poison messages", warehouseDeadLetterQueue, depth, want))
	}
	for _, m := range poisonMessages() {
		if !slices.ContainsFunc(reasons, func(r string) bool { return strings.HasPrefix(r, m.MessageId+":") }) {
			o.Failures = append(o.Failures, fmt.Sprintf("poison message %s is not in %s", m.MessageId, warehouseDeadLetterQueue))
		}
	}
}

// peekReasons reads up to n messages of queue without taking them ("id: reason"); closing
// the channel hands them back.
func peekReasons(ctx context.Context, url, queue string, n int) ([]string, error) {
	msgs, err := peekDeadLetters(ctx, url, queue, n)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range msgs {
		reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		if reason == "" {
			// Dead-lettered by the broker itself (x-delivery-limit, say), not by a consumer.
			if r, ok := d.Headers["x-first-death-reason"].(string); ok {
				reason = "broker: " + r
			}
		}
		if len(reason) > 120 {
			reason = reason[:120] + "…"
		}
		out = append(out, d.MessageId+": "+reason)
	}
	slices.Sort(out)
	return out, nil
}

// peekDeadLetters reads up to n messages of queue (n <= 0: as many as it holds) without
// taking them: closing the channel hands them back.
func peekDeadLetters(ctx context.Context, url, queue string, n int) ([]amqp.Delivery, error) {
	conn, err := dialAMQP(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if n <= 0 {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return nil, err
		}
		n = q.Messages
	}
	var out []amqp.Delivery
	for range n {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, nil
	}
	// Handed back with a reject on the same channel, then waited for: a quorum queue shows
	// them again only once its log applied the reject, and whoever reads the queue next (a
	// replay's depth) must find them all.
	if err := ch.Nack(out[len(out)-1].DeliveryTag, true, true); err != nil {
		return nil, fmt.Errorf("hand back what was peeked: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = poll(wctx, 20*time.Millisecond, func() (bool, error) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages >= len(out), err
	})
	if err != nil {
		return nil, fmt.Errorf("wait for %s to hold the %d messages peeked again: %w", queue, len(out), err)
	}
	return out, nil
}

// checkAPIAfterCommit requires that the order whose answer the crash swallowed was
// acknowledged to its client after all (its retry with the same key got it), and that no
// order exists that no client was told about.
func checkAPIAfterCommit(ctx context.Context, e *Env, o *Outcome) {
	checkNoOrphans(ctx, e, o)
	logs, err := e.Target.Logs(ctx, OrdersAPI)
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("read the orders API's log: %v", err))
		return
	}
	id := lastOrderBeforeCrash(logs)
	if id == "" {
		o.Failures = append(o.Failures, "no \"order created\" line before the crash in the orders API's log")
		return
	}
	var key string
	for k, v := range e.Result.Acknowledged {
		if v == id {
			key = k
		}
	}
	if key == "" {
		o.Failures = append(o.Failures, fmt.Sprintf("order %s, committed just before the crash, was never acknowledged to its client", id))
		return
	}
	e.Saw("order %s committed just before the crash; its client retried (key %s) and got it: %d retries, %d replays in all",
		id, key, e.Result.Retries, e.Result.Replays)
	if e.Result.Retries == 0 {
		o.Failures = append(o.Failures, "the load generator never retried, though the API died under it")
	}
}

// lastOrderBeforeCrash returns the order id of the last "order created" line of the orders
// API's first incarnation: the order whose commit hit the crash point.
func lastOrderBeforeCrash(logs string) string {
	var id string
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if isDeathLine(line) {
			return id
		}
		if !strings.Contains(line, logOrderCreated) {
			continue
		}
		var entry struct {
			OrderID string `json:"order_id"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.OrderID != "" {
			id = entry.OrderID
		}
	}
	return id
}

// countLines counts the lines of logs containing s.
func countLines(logs, s string) int {
	n := 0
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

package bench

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	warehousepg "github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// ConsumePrefetch is the AMQP prefetch of every consumer of item 9: pkg/inbox/inboxrabbitmq's
// default, which both services keep (<SERVICE>_CONSUMER_PREFETCH).
const ConsumePrefetch = inboxrabbitmq.DefaultPrefetch

// ConsumeBatchWait is the BatchWait of item 9's drains in batches: a worker done with its
// batch finds only the few deliveries the broker sent since the acknowledgements, and waits
// this long for the rest of the batch, which the broker sends within it while it has a
// backlog. Without the wait, batches of 16 ran half full (8.0 messages each on average) and
// the drain 20–25% slower (quick runs, 2026-12-04).
const ConsumeBatchWait = time.Millisecond

// MultipleAckEvery is how often limit C's second consumer acknowledges: every 16th delivery,
// with multiple, settling the 15 before it too (and the last ones at the end).
const MultipleAckEvery = 16

// SpreadSKUs is how many SKUs the orders of the warehouse's spread drains are spread over, in
// turn: no two of the deliveries in hand at once share a stock row.
const SpreadSKUs = 10_000

// ConsumeKind is what drains the backlog in one measurement of item 9.
type ConsumeKind int

const (
	// ConsumeAckEach is limit C: a bare amqp091-go consumer that acknowledges each delivery.
	ConsumeAckEach ConsumeKind = iota
	// ConsumeAckMultiple is limit C's second consumer: the same, acknowledging every
	// [MultipleAckEvery]th delivery with multiple.
	ConsumeAckMultiple
	// ConsumeInboxNoop is pkg/inbox/inboxrabbitmq's consumer with a handler that does
	// nothing: the inbox's own insert and the commit.
	ConsumeInboxNoop
	// ConsumeInboxSpread is the consumer with the warehouse's real handler, on orders spread
	// over [SpreadSKUs] SKUs.
	ConsumeInboxSpread
	// ConsumeInboxHot is the consumer with the warehouse's real handler, every order on one
	// of the five catalogue SKUs in turn: the hot rows of items 5 and 7.
	ConsumeInboxHot
)

// String names the kind in progress lines and in the names of the run's databases.
func (k ConsumeKind) String() string {
	switch k {
	case ConsumeAckEach:
		return "ack-each"
	case ConsumeAckMultiple:
		return "ack-multiple"
	case ConsumeInboxNoop:
		return "noop"
	case ConsumeInboxSpread:
		return "spread"
	case ConsumeInboxHot:
		return "hot"
	}
	return fmt.Sprintf("ConsumeKind(%d)", int(k))
}

// Inbox reports whether k is the inbox consumer (item 9) rather than a bare one (limit C).
func (k ConsumeKind) Inbox() bool { return k >= ConsumeInboxNoop }

// ConsumeResult is one drain of item 9: limit C or the inbox consumer.
type ConsumeResult struct {
	Kind ConsumeKind
	// Concurrency is the inbox consumer's (transactions at once, each of up to Batch
	// messages); 0 for limit C.
	Concurrency int
	// Batch is the inbox consumer's BatchSize (messages per transaction, each under a
	// savepoint); 0 for limit C, and 0 or 1 is a transaction per message.
	Batch int
	// AckEvery is the inbox consumer's AckEvery (processed deliveries acknowledged together
	// with one multiple ack; 1: each at once, alone); 0 for limit C, and 0 is the library's
	// default, [inboxrabbitmq.DefaultAckEvery].
	AckEvery int
	// BatchWait is the inbox consumer's BatchWait (how long a batch waits to fill); 0 for
	// limit C and without batches.
	BatchWait time.Duration
	// Prefetch is the consumer's AMQP prefetch count.
	Prefetch int
	// Messages is the backlog drained.
	Messages int
	// Rate is Messages over the time from the consumer's start until the last one was
	// acknowledged (limit C: and the broker had taken every acknowledgement).
	Rate float64
	// Fill is the rate at which the backlog was published into the queue, outside the
	// measured time.
	Fill float64
	// Failed counts the inbox consumer's failed attempts, each retried.
	Failed int
	// CPU is what the bench's process, the consumer's PostgreSQL backends (item 9 only) and
	// the broker spent on the drain.
	CPU *CPUUsage
	Err error
}

// Batched reports whether r is the inbox consumer handling several deliveries per
// transaction.
func (r ConsumeResult) Batched() bool { return r.Batch > 1 }

// Mode says how the inbox consumer of r takes its deliveries: "a transaction per message, an
// ack per message", or "batches of 16 (2 transactions at once), filled for up to 1ms,
// multiple acks every 8".
func (r ConsumeResult) Mode() string {
	tx := "a transaction per message"
	if r.Batched() {
		tx = fmt.Sprintf("batches of %d (%d transaction%s at once)", r.Batch, r.Concurrency, plural(r.Concurrency))
		if r.BatchWait > 0 {
			tx += fmt.Sprintf(", filled for up to %s", r.BatchWait)
		}
	}
	ack := "an ack per message"
	if every := cmp.Or(r.AckEvery, inboxrabbitmq.DefaultAckEvery); every > 1 {
		ack = fmt.Sprintf("multiple acks every %d", every)
	}
	return tx + ", " + ack
}

// consumeVariants returns the drains of item 9 in run order: limit C acknowledging each
// delivery, then every 16th with multiple; then, for each handler, the inbox consumer with a
// transaction and an ack per message at each of s.ConsumeConcurrency, and in batches of each
// of s.ConsumeBatches, with as many transactions at once as the prefetch holds batches
// (the library's default), a BatchWait of [ConsumeBatchWait] and multiple acks every
// [inboxrabbitmq.DefaultAckEvery].
func consumeVariants(s Sizes) []ConsumeResult {
	out := []ConsumeResult{{Kind: ConsumeAckEach}, {Kind: ConsumeAckMultiple}}
	for _, k := range []ConsumeKind{ConsumeInboxNoop, ConsumeInboxSpread, ConsumeInboxHot} {
		for _, c := range s.ConsumeConcurrency {
			out = append(out, ConsumeResult{Kind: k, Concurrency: c, Batch: 1, AckEvery: 1})
		}
		for _, b := range s.ConsumeBatches {
			out = append(out, ConsumeResult{Kind: k, Concurrency: ConsumePrefetch / b, Batch: b, AckEvery: inboxrabbitmq.DefaultAckEvery, BatchWait: ConsumeBatchWait})
		}
	}
	for i := range out {
		out[i].Prefetch, out[i].Messages = ConsumePrefetch, s.ConsumeBacklog
	}
	return out
}

// consume is item 9. Every drain gets a backlog of its own in one quorum queue, declared as
// the warehouse declares its queue (warehouseamqp.Topology), filled before the drain and
// outside its measured time.
func (e *env) consume(ctx context.Context, s Sizes) []ConsumeResult {
	top := warehouseamqp.Topology{
		Exchange: e.amqpName("consume.events"), DeadLetterExchange: e.amqpName("consume.dlx"),
		Queue: e.amqpName("consume.warehouse"), DeadLetterQueue: e.amqpName("consume.warehouse.dead"),
	}.WithDefaults()
	e.deleteLater([]string{top.Exchange, top.DeadLetterExchange}, []string{top.Queue, top.DeadLetterQueue})
	var admin *queueAdmin
	err := e.withChannel(top.Declare)
	if err != nil {
		err = fmt.Errorf("declare the consume topology: %w", err)
	} else {
		admin, err = e.openQueueAdmin(top.Queue)
	}
	if admin != nil {
		defer admin.Close()
	}

	var out []ConsumeResult
	for _, v := range consumeVariants(s) {
		if ctx.Err() != nil {
			break
		}
		if v.Kind.Inbox() {
			e.progress("item 9: the inbox consumer drains %s messages: %s, concurrency %d, prefetch %d, %s", FormatCount(v.Messages), v.Kind, v.Concurrency, v.Prefetch, v.Mode())
		} else {
			e.progress("limit C: a bare consumer drains %s messages: %s, prefetch %d", FormatCount(v.Messages), v.Kind, v.Prefetch)
		}
		r := v
		switch {
		case err != nil:
			r.Err = err
		case v.Kind.Inbox():
			r = e.consumeInbox(ctx, top, admin, v)
		default:
			r = e.consumeLimit(ctx, top, admin, v)
		}
		out = append(out, r)
		line := fmt.Sprintf("%s (filled at %s); CPU per 1,000: %s", FormatRate(r.Rate, "msg/s"), FormatRate(r.Fill, "msg/s"), FormatCPU(r.CPU, "consumer"))
		if r.Failed > 0 {
			line += fmt.Sprintf("; %d attempts failed and were retried", r.Failed)
		}
		e.progress("  %s", resultOrError(line, r.Err))
	}
	return out
}

// consumeEvent returns the i-th message of a backlog for kind: an OrderCreated of one line,
// on one of the five catalogue SKUs in turn, or for [ConsumeInboxSpread] on one of
// [SpreadSKUs] in turn.
func consumeEvent(kind ConsumeKind, exchange string, i int) outbox.Message {
	if kind == ConsumeInboxSpread {
		_, msg := orderEventOf(exchange, i, spreadSKU(i))
		return msg
	}
	_, msg := orderEvent(exchange, i)
	return msg
}

// spreadSKU is the SKU of the i-th order of a spread backlog; seedSpreadSQL creates them.
func spreadSKU(i int) string { return fmt.Sprintf("SPREAD-%05d", i%SpreadSKUs) }

// seedSpreadSQL creates the stock of the spread SKUs, $1 of them with $2 each, and their
// 'restock' ledger rows, as the warehouse's catalogue migration seeds its own.
const seedSpreadSQL = `
WITH inserted AS (
    INSERT INTO stock (sku, name, available)
    SELECT 'SPREAD-' || lpad(g::text, 5, '0'), 'Bench item ' || g, $2
    FROM generate_series(0, $1::int - 1) g
    RETURNING sku, available
)
INSERT INTO stock_movements (sku, delta, kind)
SELECT sku, available, 'restock' FROM inserted`

// consumeStock is the stock of every SKU of a warehouse drain: more than any backlog takes.
const consumeStock = 1_000_000_000

// Fill settings: the publishing connections of a backlog, each with the outbox publisher's
// batched socket and limit A's window unconfirmed. Into the quorum queue on a 2-core machine
// the batched socket filled 1.1–1.4× as fast as amqp091-go's own; one, two or four
// connections were within the machine's noise of each other (7,000–12,000 msg/s).
const (
	fillChannels = 2
	fillBatched  = true
)

// fill empties the queue and publishes n messages of kind to it, with confirms, window
// unconfirmed on each of the fill's channels; it returns the rate, once the queue holds all
// n.
func (e *env) fill(ctx context.Context, top warehouseamqp.Topology, admin *queueAdmin, kind ConsumeKind, n, window int) (float64, error) {
	if _, err := admin.purge(); err != nil {
		return 0, err
	}
	chans, closeAll, err := e.confirmChannels("consume-fill", fillChannels, fillBatched)
	defer closeAll()
	if err != nil {
		return 0, fmt.Errorf("fill %s: %w", top.Queue, err)
	}
	var next atomic.Int64
	start := time.Now()
	confirmed, err := publishWindowed(ctx, chans, window, func() (string, string, amqp.Publishing, bool) {
		i := next.Add(1) - 1
		if i >= int64(n) {
			return "", "", amqp.Publishing{}, false
		}
		msg := consumeEvent(kind, top.Exchange, int(i))
		return top.Exchange, msg.RoutingKey, publishing(msg), true
	})
	if err != nil {
		return 0, fmt.Errorf("fill %s: %d of %d confirmed: %w", top.Queue, confirmed, n, err)
	}
	// A message routed nowhere is confirmed too: the queue must hold every one.
	if err := admin.waitDepth(ctx, n, 30*time.Second); err != nil {
		return 0, fmt.Errorf("fill %s: %w", top.Queue, err)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// consumeLimit is limit C: a bare amqp091-go consumer with prefetch v.Prefetch drains a
// backlog of v.Messages, acknowledging each delivery ([ConsumeAckEach]) or every
// [MultipleAckEvery]th with multiple ([ConsumeAckMultiple]). The clock and the CPU of the
// bench's process and of the broker run from the consume until the channel is closed: the
// broker answers the close after it has taken every acknowledgement sent before it.
func (e *env) consumeLimit(ctx context.Context, top warehouseamqp.Topology, admin *queueAdmin, v ConsumeResult) ConsumeResult {
	res := v
	var err error
	if res.Fill, err = e.fill(ctx, top, admin, v.Kind, v.Messages, e.cfg.Sizes.ConfirmWindow); err != nil {
		res.Err = err
		return res
	}
	res.Rate, res.CPU, res.Err = e.drainBare(ctx, top.Queue, admin, v)
	return res
}

// drainBare is the drain of [env.consumeLimit]: it returns the rate and the CPU spent.
func (e *env) drainBare(ctx context.Context, queue string, admin *queueAdmin, v ConsumeResult) (float64, *CPUUsage, error) {
	every := 1
	if v.Kind == ConsumeAckMultiple {
		every = MultipleAckEvery
	}
	conn, err := e.dial("consume-c")
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(v.Prefetch, 0, false); err != nil {
		return 0, nil, fmt.Errorf("set prefetch %d: %w", v.Prefetch, err)
	}
	e.settleBroker(ctx)

	meter := e.startCPU(ctx, "")
	start := time.Now()
	deliveries, err := ch.Consume(queue, "bench-"+e.id+"-consume-c", false, false, false, false, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	deadline := time.NewTimer(drainTimeout(v.Messages))
	defer deadline.Stop()
	watch := time.NewTicker(time.Second)
	defer watch.Stop()
	got, lastGot, lastProgress := 0, 0, start
	for got < v.Messages {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, nil, fmt.Errorf("the broker closed the channel after %d of %d deliveries", got, v.Messages)
			}
			got++
			if got%every == 0 || got == v.Messages {
				if err := d.Ack(every > 1); err != nil {
					return 0, nil, fmt.Errorf("acknowledge delivery %d: %w", got, err)
				}
			}
		case now := <-watch.C:
			if got != lastGot {
				lastGot, lastProgress = got, now
			} else if now.Sub(lastProgress) > stallTimeout {
				return 0, nil, fmt.Errorf("no delivery for %s after %d of %d", stallTimeout, got, v.Messages)
			}
		case <-deadline.C:
			return 0, nil, fmt.Errorf("drained %d of %d messages within %s", got, v.Messages, drainTimeout(v.Messages))
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
	if err := ch.Close(); err != nil {
		return 0, nil, fmt.Errorf("close the consuming channel: %w", err)
	}
	elapsed := time.Since(start)
	cpu := meter.stop(ctx, v.Messages)
	// Every delivery acknowledged: nothing goes back to the queue with the closed channel.
	if err := admin.waitDepth(ctx, 0, 30*time.Second); err != nil {
		return 0, nil, fmt.Errorf("after the drain: %w", err)
	}
	return float64(v.Messages) / elapsed.Seconds(), cpu, nil
}

// stallTimeout ends a drain in which nothing was delivered or processed for that long.
const stallTimeout = 30 * time.Second

// consumeInbox is one drain of item 9: pkg/inbox/inboxrabbitmq's consumer, with v.Prefetch,
// v.Concurrency, v.Batch and v.AckEvery, on a fresh database of its own migrated for the
// handler of v.Kind (the inbox's migrations, or the warehouse's, which include them), drains
// a backlog of v.Messages. The clock and the CPU of the bench's process, of the consumer's
// PostgreSQL backends and of the broker run from the consumer's start until the Processed
// hook counted every message; then the queue must be empty and the inbox table hold a row
// per message (and the warehouse a reservation per order).
func (e *env) consumeInbox(ctx context.Context, top warehouseamqp.Topology, admin *queueAdmin, v ConsumeResult) ConsumeResult {
	res := v
	suffix := fmt.Sprintf("consume_%s_%d_b%d", v.Kind, v.Concurrency, v.Batch)
	dbURL, err := e.createDatabase(ctx, suffix, "")
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { _ = e.dropDatabase(context.WithoutCancel(ctx), e.dbName(suffix)) }() // free the disk now
	appName := fmt.Sprintf("bench-%s-inbox-%s-%d-b%d-", e.id, v.Kind, v.Concurrency, v.Batch)
	url, err := withAppName(dbURL, appName+"pool")
	if err != nil {
		res.Err = err
		return res
	}
	// A connection per transaction at once, and one for the checks after the drain.
	pool, err := openPool(ctx, url, int32(v.Concurrency+1))
	if err != nil {
		res.Err = err
		return res
	}
	defer pool.Close()
	name, handler, err := e.consumeHandler(ctx, pool, top, v.Kind)
	if err != nil {
		res.Err = err
		return res
	}
	if res.Fill, err = e.fill(ctx, top, admin, v.Kind, v.Messages, e.cfg.Sizes.ConfirmWindow); err != nil {
		res.Err = err
		return res
	}
	// The handlers' connections exist before the clock starts, as in a running service,
	// and their backends are found for the CPU column.
	if err := warmPool(ctx, pool, v.Concurrency); err != nil {
		res.Err = err
		return res
	}
	// The WAL of the drains before this one is written out now, not by a checkpoint that
	// would fall inside this drain (a drain of 200,000 messages writes enough to start one).
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		e.progress("  CHECKPOINT before the drain failed; a checkpoint may fall inside it: %v", err)
	}
	res.Rate, res.Failed, res.CPU, res.Err = e.drainInbox(ctx, pool, top, admin, v, name, handler, appName)
	if res.Err == nil {
		res.Err = checkConsumed(ctx, pool, v)
	}
	return res
}

// consumeHandler migrates the database of a drain of kind and returns the inbox consumer's
// name and handler: for [ConsumeInboxNoop] the inbox's migrations and a handler that does
// nothing; for the warehouse's drains its migrations, the stock of the five catalogue SKUs
// and of [SpreadSKUs] more (both in every warehouse drain, so that the two see the same
// table), and its real handler on its postgres store.
func (e *env) consumeHandler(ctx context.Context, pool *pgxpool.Pool, top warehouseamqp.Topology, kind ConsumeKind) (string, inboxrabbitmq.Handler, error) {
	if kind == ConsumeInboxNoop {
		if err := inbox.Migrate(ctx, pool); err != nil {
			return "", nil, fmt.Errorf("migrate inbox: %w", err)
		}
		return "bench", func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil }, nil
	}
	if err := warehousepg.Migrate(ctx, pool); err != nil {
		return "", nil, fmt.Errorf("migrate warehouse: %w", err)
	}
	store, err := warehousepg.NewStore(pool, warehousepg.StoreConfig{Exchange: top.Exchange})
	if err != nil {
		return "", nil, fmt.Errorf("warehouse store: %w", err)
	}
	for _, sku := range skus {
		if _, _, err := store.SetStock(ctx, sku, "", consumeStock); err != nil {
			return "", nil, fmt.Errorf("stock %s: %w", sku, err)
		}
	}
	if _, err := pool.Exec(ctx, seedSpreadSQL, SpreadSKUs, consumeStock); err != nil {
		return "", nil, fmt.Errorf("stock of %d spread SKUs: %w", SpreadSKUs, err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE stock"); err != nil {
		return "", nil, fmt.Errorf("analyze stock: %w", err)
	}
	return warehouseamqp.ConsumerName, warehouseamqp.NewHandler(store, warehouseamqp.HandlerConfig{Logger: e.log}), nil
}

// warmPool opens n connections of pool.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("open the consumer's connections: %w", err)
		}
		conns = append(conns, c)
	}
	return nil
}

// drainInbox runs the inbox consumer until its Processed hook counted v.Messages, and
// returns the rate, the failed attempts and the CPU spent.
func (e *env) drainInbox(ctx context.Context, pool *pgxpool.Pool, top warehouseamqp.Topology, admin *queueAdmin, v ConsumeResult,
	name string, handler inboxrabbitmq.Handler, appName string) (float64, int, *CPUUsage, error) {
	var (
		processed, failed, dead atomic.Int64
		done                    = make(chan struct{})
		doneOnce                sync.Once
		lastErr                 atomic.Pointer[error]
	)
	noteErr := func(err error) {
		if err != nil {
			lastErr.Store(&err)
		}
	}
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL: e.cfg.AMQPURL, Queue: top.Queue, Name: name, Handler: handler,
		Prefetch: v.Prefetch, Concurrency: v.Concurrency, BatchSize: v.Batch, AckEvery: v.AckEvery, BatchWait: v.BatchWait,
		DeadLetterExchange: top.DeadLetterExchange, DeadLetterRoutingKey: top.Queue,
		Setup:          top.Declare,
		RetryBaseDelay: 50 * time.Millisecond, // as item 5's: a retried attempt must not hold up the drain's end
		Logger:         e.log,
		Hooks: inboxrabbitmq.Hooks{
			Processed: func(inboxrabbitmq.ProcessedMessage) {
				if processed.Add(1) == int64(v.Messages) {
					doneOnce.Do(func() { close(done) })
				}
			},
			HandlerError: func(f inboxrabbitmq.HandlerFailure) { failed.Add(1); noteErr(f.Err) },
			DeadLettered: func(inboxrabbitmq.DeadLetter) { dead.Add(1) },
			Connected:    func(c inboxrabbitmq.ConnectionChange) { noteErr(c.Err) },
		},
	})
	if err != nil {
		return 0, 0, nil, err
	}
	e.settleBroker(ctx)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runDone := make(chan struct{})
	meter := e.startCPU(ctx, appName)
	start := time.Now()
	go func() {
		defer close(runDone)
		_ = consumer.Run(runCtx)
	}()
	defer func() { stop(); <-runDone }()

	stalled := func(n int64) error {
		err := fmt.Errorf("processed %d of %d messages, none for %s", n, v.Messages, stallTimeout)
		if last := lastErr.Load(); last != nil {
			err = fmt.Errorf("%w; last error: %w", err, *last)
		}
		return err
	}
	deadline := time.NewTimer(drainTimeout(v.Messages))
	defer deadline.Stop()
	watch := time.NewTicker(time.Second)
	defer watch.Stop()
	last, lastProgress := int64(0), start
wait:
	for {
		select {
		case <-done:
			break wait
		case now := <-watch.C:
			if n := processed.Load(); n != last {
				last, lastProgress = n, now
			} else if now.Sub(lastProgress) > stallTimeout {
				return 0, 0, nil, stalled(n)
			}
		case <-deadline.C:
			return 0, 0, nil, fmt.Errorf("processed %d of %d messages within %s", processed.Load(), v.Messages, drainTimeout(v.Messages))
		case <-ctx.Done():
			return 0, 0, nil, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	cpu := meter.stop(ctx, v.Messages)
	stop()
	<-runDone
	if n := dead.Load(); n > 0 {
		return 0, 0, nil, fmt.Errorf("%d messages dead-lettered", n)
	}
	// The consumer stopped: a message not acknowledged is back in the queue.
	if err := admin.waitDepth(ctx, 0, 30*time.Second); err != nil {
		return 0, 0, nil, fmt.Errorf("after the drain: %w", err)
	}
	return float64(v.Messages) / elapsed.Seconds(), int(failed.Load()), cpu, nil
}

// checkConsumed checks that a drain did its work: a row per message in the inbox, and for the
// warehouse's drains a reservation per order.
func checkConsumed(ctx context.Context, pool *pgxpool.Pool, v ConsumeResult) error {
	checks := []struct{ what, sql string }{{"inbox rows", "SELECT count(*) FROM " + inbox.DefaultMessagesTable}}
	if v.Kind != ConsumeInboxNoop {
		checks = append(checks, struct{ what, sql string }{"reservations", "SELECT count(*) FROM reservations WHERE status = 'RESERVED'"})
	}
	for _, c := range checks {
		var n int
		if err := pool.QueryRow(ctx, c.sql).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", c.what, err)
		}
		if n != v.Messages {
			return fmt.Errorf("%d %s after a drain of %d messages", n, c.what, v.Messages)
		}
	}
	return nil
}

// settleBroker waits until the broker used less than a tenth of a core for settleWindow, at
// most settleTimeout: a quorum queue moves what a fill appended to its log into segment
// files after the confirms, and that work belongs to the fill, not to the drain measured
// next. Without the broker's process on this machine it returns at once.
func (e *env) settleBroker(ctx context.Context) {
	pid := e.brokerPID()
	if pid <= 0 {
		return
	}
	prev, err := readProcTicks(pid, "")
	if err != nil {
		return
	}
	start := time.Now()
	for time.Since(start) < settleTimeout {
		select {
		case <-ctx.Done():
			return
		case <-time.After(settleWindow):
		}
		t, err := readProcTicks(pid, "")
		if err != nil || t < prev {
			return
		}
		if ticks(t-prev) < settleWindow/10 {
			return
		}
		prev = t
	}
	e.progress("  the broker was still busy %s after the fill (other clients?): measuring anyway", settleTimeout)
}

const (
	settleWindow  = 200 * time.Millisecond
	settleTimeout = 5 * time.Second
)

// queueAdmin inspects and purges one queue on a connection of its own.
type queueAdmin struct {
	queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
}

func (e *env) openQueueAdmin(queue string) (*queueAdmin, error) {
	conn, err := e.dial("consume-admin")
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return &queueAdmin{queue: queue, conn: conn, ch: ch}, nil
}

// depth returns the queue's ready messages.
func (q *queueAdmin) depth() (int, error) {
	s, err := q.ch.QueueDeclarePassive(q.queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", q.queue, err)
	}
	return s.Messages, nil
}

func (q *queueAdmin) purge() (int, error) {
	n, err := q.ch.QueuePurge(q.queue, false)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", q.queue, err)
	}
	return n, nil
}

// waitDepth polls the queue until it holds want ready messages, at most timeout.
func (q *queueAdmin) waitDepth(ctx context.Context, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := q.depth()
		if err != nil || got == want {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s holds %d messages, not %d, after %s", q.queue, got, want, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (q *queueAdmin) Close() { _ = q.conn.Close() }

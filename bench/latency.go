package bench

import (
	"context"
	"errors"
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
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	warehousepg "github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// LatencyResult is one fixed-rate run of item 5.
type LatencyResult struct {
	// Rate is the rate asked for; Achieved the rate of the measured commits. Ceiling is
	// true when Rate is the writers' own ceiling (limit B, measured in the same run).
	Rate     int
	Achieved float64
	Ceiling  bool
	// Notify is true with LISTEN/NOTIFY wake-ups, false when polling every 100 ms only.
	Notify bool
	// Tracing is how the relay traces.
	Tracing Tracing
	// Relay is the relay of item 10 ([RelayPoll] or [RelayWAL]); empty in item 5 (the
	// polling relay on the configured server). Sustained marks item 10's sustained run.
	Relay     string
	Sustained bool
	// Duration is the measured span (after the warm-up).
	Duration time.Duration
	// Confirm is commit → broker confirm; Reserved is commit → the warehouse's inbox commit;
	// Handled is commit → the warehouse's handler starting on it (the part of Reserved spent
	// on the way and waiting in the queue).
	Confirm, Handled, Reserved Latencies
	// Missing counts measured orders whose confirm or reservation did not arrive in time.
	Missing int
	Err     error
}

// stopwatch collects, per message id, when the writer's COMMIT returned, when the broker
// confirmed the message, and when the warehouse committed its inbox transaction. All three
// clocks are this process's, so no clock skew enters the figures.
type stopwatch struct {
	mu        sync.Mutex
	committed map[string]time.Time // measured messages only
	confirmed map[string]time.Time
	reserved  map[string]time.Time
	handled   map[string]time.Time // when the warehouse's handler started on the message
}

func newStopwatch() *stopwatch {
	return &stopwatch{committed: map[string]time.Time{}, confirmed: map[string]time.Time{}, reserved: map[string]time.Time{}, handled: map[string]time.Time{}}
}

func (s *stopwatch) mark(m map[string]time.Time, id string, at time.Time) {
	s.mu.Lock()
	m[id] = at
	s.mu.Unlock()
}

// complete reports whether every measured message was confirmed and reserved.
func (s *stopwatch) complete() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.committed {
		if _, ok := s.confirmed[id]; !ok {
			return false
		}
		if _, ok := s.reserved[id]; !ok {
			return false
		}
	}
	return true
}

// latencies returns the latency samples of the measured messages (until the confirm, until
// the warehouse's handler last started on it, until its inbox commit) and how many of them
// lack a confirm or a reservation.
func (s *stopwatch) latencies() (confirm, handled, reserved []time.Duration, missing int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.committed {
		at, ok1 := s.confirmed[id]
		if ok1 {
			confirm = append(confirm, max(at.Sub(c), 0))
		}
		rt, ok2 := s.reserved[id]
		if ok2 {
			reserved = append(reserved, max(rt.Sub(c), 0))
			if ht, ok := s.handled[id]; ok {
				handled = append(handled, max(ht.Sub(c), 0))
			}
		}
		if !ok1 || !ok2 {
			missing++
		}
	}
	return confirm, handled, reserved, missing
}

// timedBeginner hands the inbox transactions that note when they committed: the moment the
// warehouse's reservation became visible.
type timedBeginner struct {
	pool *pgxpool.Pool
	sw   *atomic.Pointer[stopwatch]
}

func (b timedBeginner) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &timedTx{Tx: tx, sw: b.sw}, nil
}

type timedTx struct {
	pgx.Tx
	sw *atomic.Pointer[stopwatch]
	id string // set by the handler
}

func (t *timedTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	if sw := t.sw.Load(); sw != nil && t.id != "" {
		sw.mark(sw.reserved, t.id, time.Now())
	}
	return nil
}

var _ inbox.TxBeginner = timedBeginner{}

// latencyRig is the pipeline of item 5: the writer's database with its outbox, the
// warehouse's database with its inbox, and the warehouse's consumer (its real handler,
// pkg/inbox/inboxrabbitmq, quorum queues), running in this process.
type latencyRig struct {
	e          *env
	ordersURL  string
	top        warehouseamqp.Topology
	sw         atomic.Pointer[stopwatch]
	stopConsum func()
}

func (e *env) newLatencyRig(ctx context.Context) (*latencyRig, error) {
	rig := &latencyRig{e: e}
	var err error
	if rig.ordersURL, err = e.createDatabase(ctx, "lat_orders", ""); err != nil {
		return nil, err
	}
	orders, err := openPool(ctx, rig.ordersURL, 2)
	if err != nil {
		return nil, err
	}
	err = migrateWriter(ctx, orders)
	orders.Close()
	if err != nil {
		return nil, err
	}

	whURL, err := e.createDatabase(ctx, "lat_warehouse", "")
	if err != nil {
		return nil, err
	}
	const concurrency = 8 // the warehouse's default
	wh, err := openPool(ctx, whURL, concurrency+2)
	if err != nil {
		return nil, err
	}
	e.later(func(context.Context) error { wh.Close(); return nil })
	if err := warehousepg.Migrate(ctx, wh); err != nil {
		return nil, fmt.Errorf("migrate warehouse: %w", err)
	}
	repo, err := warehousepg.NewStore(wh, warehousepg.StoreConfig{Exchange: e.amqpName("events")})
	if err != nil {
		return nil, err
	}
	for _, sku := range skus {
		if _, _, err := repo.SetStock(ctx, sku, "", 1_000_000_000); err != nil {
			return nil, fmt.Errorf("stock %s: %w", sku, err)
		}
	}

	rig.top = warehouseamqp.Topology{
		Exchange: e.amqpName("events"), DeadLetterExchange: e.amqpName("dlx"),
		Queue: e.amqpName("warehouse"), DeadLetterQueue: e.amqpName("warehouse.dead"), DeliveryLimit: 20,
	}
	e.deleteLater([]string{rig.top.Exchange, rig.top.DeadLetterExchange}, []string{rig.top.Queue, rig.top.DeadLetterQueue})
	handler := warehouseamqp.NewHandler(repo, warehouseamqp.HandlerConfig{Logger: e.log})
	connected := make(chan struct{})
	var once sync.Once
	consumer, err := inboxrabbitmq.NewConsumer(timedBeginner{pool: wh, sw: &rig.sw}, inboxrabbitmq.Config{
		URL:   e.cfg.AMQPURL,
		Queue: rig.top.Queue,
		Name:  warehouseamqp.ConsumerName,
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if t, ok := tx.(*timedTx); ok {
				t.id = d.ID
				if sw := rig.sw.Load(); sw != nil {
					sw.mark(sw.handled, d.ID, time.Now())
				}
			}
			return handler(ctx, tx, d)
		},
		Prefetch:             32,
		Concurrency:          concurrency,
		DeadLetterExchange:   rig.top.DeadLetterExchange,
		DeadLetterRoutingKey: rig.top.Queue,
		Setup:                rig.top.Declare,
		RetryBaseDelay:       50 * time.Millisecond,
		Logger:               e.log,
		Hooks: inboxrabbitmq.Hooks{Connected: func(c inboxrabbitmq.ConnectionChange) {
			if c.Up {
				once.Do(func() { close(connected) })
			}
		}},
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = consumer.Run(runCtx)
	}()
	rig.stopConsum = func() { cancel(); <-done }
	e.later(func(context.Context) error { rig.stopConsum(); return nil })
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		return nil, errors.New("the warehouse consumer did not connect within 30s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// Prime the pipeline: the first orders find cold connections, caches and plans, and the
	// backlog they leave would otherwise be measured in the first run.
	if r := rig.run(ctx, 100, true, TracingOff, 0, time.Second, ""); r.Err != nil {
		return nil, fmt.Errorf("prime the pipeline: %w", r.Err)
	}
	return rig, nil
}

// run writes orders at rate for warmup + d with an open-loop pacer (16 writers), through a
// relay woken by LISTEN/NOTIFY or polling every 100 ms, and measures the orders scheduled
// after the warm-up.
//
// relay is item 10's: [RelayWAL] runs the WAL relay, with a pool of its own, instead of the
// polling relay; "" and [RelayPoll] the polling relay.
func (rig *latencyRig) run(ctx context.Context, rate int, notify bool, tracing Tracing, warmup, d time.Duration, relay string) LatencyResult {
	res := LatencyResult{Rate: rate, Notify: notify, Tracing: tracing, Relay: relay, Duration: d}
	sw := newStopwatch()
	rig.sw.Store(sw)
	defer rig.sw.Store(nil)

	const writers = latencyWriters
	pool, err := openPool(ctx, rig.ordersURL, writers+3)
	if err != nil {
		res.Err = err
		return res
	}
	defer pool.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: rig.e.cfg.AMQPURL, ConnectionName: "bench-" + rig.e.id + "-latency-relay",
		Connections: outbox.DefaultInFlightBatches, Logger: rig.e.log})
	if err != nil {
		res.Err = err
		return res
	}
	defer pub.Close()
	cfg := outbox.Config{
		BatchSize: rig.e.cfg.BatchSize,
		Logger:    rig.e.log,
		Hooks: outbox.Hooks{BatchDone: func(b outbox.BatchResult) {
			sw.mu.Lock()
			for _, m := range b.Published {
				sw.confirmed[m.ID.String()] = b.ConfirmedAt
			}
			sw.mu.Unlock()
		}},
	}
	if !notify {
		cfg.DisableNotify, cfg.PollInterval = true, 100*time.Millisecond
	}
	if tracing != TracingOff {
		tp, prop, shutdown := tracing.tracer()
		defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
		cfg.TracerProvider, cfg.Propagator = tp, prop
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var relayDone <-chan struct{}
	if relay == RelayWAL {
		relayDone, err = rig.startWAL(relayCtx, pub, cfg)
	} else {
		var r *outbox.Relay
		if r, err = outbox.NewRelay(pool, pub, cfg); err == nil {
			ran := make(chan struct{})
			go func() { defer close(ran); _ = r.Run(relayCtx) }()
			relayDone = ran
		}
	}
	if relayDone != nil {
		defer func() { stopRelay(); <-relayDone }() // a closed channel: also after the reset's stop
	}
	if err != nil {
		res.Err = err
		return res
	}

	// The pacer hands out each order at its scheduled time; the writers commit them. When
	// every writer is busy and the queue is full, the order is dropped rather than queued:
	// the run ends on time, and the achieved rate shows that the writers fell behind.
	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	jobs := make(chan time.Time, writers)
	go func() {
		defer close(jobs)
		for i := 0; ; i++ {
			at := start.Add(time.Duration(float64(i) * float64(time.Second) / float64(rate)))
			if !at.Before(end) || ctx.Err() != nil {
				return
			}
			if wait := time.Until(at); wait > 0 {
				time.Sleep(wait)
			}
			select {
			case jobs <- at:
			default:
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		n        atomic.Int64
		measured atomic.Int64
		lastAt   atomic.Int64
		errs     = make([]error, writers)
	)
	for w := range writers {
		wg.Go(func() {
			for at := range jobs {
				if errs[w] != nil {
					continue // drain the pacer
				}
				id, committedAt, err := writeOrder(ctx, pool, rig.top.Exchange, int(n.Add(1)))
				if err != nil {
					errs[w] = err
					continue
				}
				if !at.Before(measureFrom) {
					sw.mark(sw.committed, id, committedAt)
					measured.Add(1)
					lastAt.Store(committedAt.UnixNano())
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		res.Err = err
		return res
	}
	if span := time.Unix(0, lastAt.Load()).Sub(measureFrom); span > 0 {
		res.Achieved = float64(measured.Load()) / max(span, d).Seconds()
	}

	// Wait a bounded time for the stragglers: a consumer slower than the rate never catches
	// up, and its backlog must not spill into the next run.
	deadline := time.Now().Add(catchUp)
	for !sw.complete() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	confirm, handled, reserved, missing := sw.latencies()
	res.Confirm, res.Handled, res.Reserved, res.Missing = Summarize(confirm), Summarize(handled), Summarize(reserved), missing
	if missing > 0 {
		// The relay stops first: its marks would take the reset's row locks in another
		// order (a deadlock).
		stopRelay()
		<-relayDone
		if err := rig.reset(ctx, pool, sw); err != nil {
			res.Err = fmt.Errorf("reset after a saturated run: %w", err)
		}
	}
	return res
}

// startWAL starts a WAL relay on the orders database (its publication made first), with a
// pool of its own closed at the end of the run, runs it until ctx ends, and returns once it
// streams, with the channel closed when Run returned.
func (rig *latencyRig) startWAL(ctx context.Context, pub outbox.Publisher, cfg outbox.Config) (<-chan struct{}, error) {
	pool, err := openPool(ctx, rig.ordersURL, int32(2*outbox.DefaultInFlightBatches+2))
	if err != nil {
		return nil, err
	}
	if err := createPublication(ctx, pool); err != nil {
		return nil, err
	}
	w, err := outbox.NewWALRelay(pool, pub, cfg, outbox.WALConfig{URL: rig.ordersURL})
	if err != nil {
		return nil, err
	}
	return startStreaming(ctx, w)
}

// latencyWriters is how many writers a latency run has.
const latencyWriters = 16

// catchUp is how long a latency run waits, after the last order, for the confirms and
// reservations of the measured orders.
const catchUp = 5 * time.Second

// reset leaves the pipeline empty after a run the consumer could not keep up with: it marks
// the outbox's pending rows published, purges the warehouse's queue, and waits until the
// consumer finished the messages it had in hand.
func (rig *latencyRig) reset(ctx context.Context, pool *pgxpool.Pool, sw *stopwatch) error {
	if _, err := pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() WHERE published_at IS NULL"); err != nil {
		return err
	}
	if err := rig.e.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueuePurge(rig.top.Queue, false)
		return err
	}); err != nil {
		return fmt.Errorf("purge %s: %w", rig.top.Queue, err)
	}
	count := func() int {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		return len(sw.handled)
	}
	last, quietSince, deadline := count(), time.Now(), time.Now().Add(10*time.Second)
	for time.Since(quietSince) < 500*time.Millisecond && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		if n := count(); n != last {
			last, quietSince = n, time.Now()
		}
	}
	return nil
}

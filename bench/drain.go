package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// backlog returns a database holding a pre-filled outbox of rows pending rows, to be
// copied with CREATE DATABASE … TEMPLATE, and the topology its rows are published to. It is
// filled once per run and shared by the drain and memory phases.
func (e *env) backlog(ctx context.Context, rows int) (string, topology, error) {
	top, err := e.drainTopology()
	if err != nil {
		return "", topology{}, err
	}
	e.setupMu.Lock()
	defer e.setupMu.Unlock()
	name, filled := e.backlogDB, e.backlogRows
	if name != "" && filled == rows {
		return name, top, nil
	}
	suffix := fmt.Sprintf("backlog%d", rows)
	dbURL, err := e.createDatabase(ctx, suffix, "")
	if err != nil {
		return "", topology{}, err
	}
	pool, err := openPool(ctx, dbURL, 2)
	if err != nil {
		return "", topology{}, err
	}
	defer pool.Close() // a template must have no connections
	start := time.Now()
	if err := migrateWriter(ctx, pool); err != nil {
		return "", topology{}, err
	}
	if err := fillBacklog(ctx, pool, top.Exchange, rows); err != nil {
		return "", topology{}, err
	}
	e.progress("  filled a backlog of %s rows in %s", FormatCount(rows), time.Since(start).Round(time.Millisecond))
	e.backlogDB, e.backlogRows = e.dbName(suffix), rows
	return e.dbName(suffix), top, nil
}

// drainTopology declares, once per run, the exchange and queue the backlog is published to.
func (e *env) drainTopology() (topology, error) {
	e.setupMu.Lock()
	defer e.setupMu.Unlock()
	if e.drainTop != nil {
		return *e.drainTop, nil
	}
	top, err := e.declareTopology("drain")
	if err != nil {
		return topology{}, err
	}
	e.drainTop = &top
	return top, nil
}

// copyBacklog creates a database of the run from the backlog template.
func (e *env) copyBacklog(ctx context.Context, suffix string, rows int) (string, string, topology, error) {
	template, top, err := e.backlog(ctx, rows)
	if err != nil {
		return "", "", topology{}, err
	}
	dbURL, err := e.createDatabase(ctx, suffix, template)
	if err != nil {
		return "", "", topology{}, err
	}
	return e.dbName(suffix), dbURL, top, nil
}

// drain is item 3: relays relay instances, each with its own pool and RabbitMQ publisher
// and inFlight batches of batch rows in flight at once (1: the serial relay), drain a copy of the
// backlog. The clock runs from their start until the BatchDone hooks counted every row
// published; the queue is purged as it fills, and must have received every row. The CPU
// of the bench's process, of the relays' PostgreSQL backends and of the broker is sampled
// around the same span.
func (e *env) drain(ctx context.Context, relays, inFlight, batch, rows int, tracing Tracing) (DrainResult, error) {
	name, dbURL, top, err := e.copyBacklog(ctx, fmt.Sprintf("drain%d_%d_%d_%d", relays, inFlight, batch, tracing), rows)
	if err != nil {
		return DrainResult{}, err
	}
	defer func() { _ = e.dropDatabase(context.WithoutCancel(ctx), name) }() // free the disk now
	appName := fmt.Sprintf("bench-%s-relay-%d-%d-%d-", e.id, relays, inFlight, batch)
	snk, err := e.startSink(top.Queue, 200*time.Millisecond)
	if err != nil {
		return DrainResult{}, err
	}
	defer snk.Close()

	var (
		published atomic.Int64
		done      = make(chan struct{})
		doneOnce  sync.Once
		mu        sync.Mutex
		claims    []time.Duration
		publishes []time.Duration
		finishes  []time.Duration
		start     time.Time
	)
	// hooks counts the rows published and times the three steps of each cycle of one relay:
	// the claim (from the end of its previous cycle to the Polled hook), the publish until
	// the last confirm (BatchResult.ConfirmedAt), and the mark and commit (until BatchDone).
	// The split means what it says only for the serial relay: with batches in flight the
	// steps of one batch overlap those of the next.
	hooks := func() outbox.Hooks {
		var cycleStart, claimedAt time.Time // under mu: a pipelined relay calls from several goroutines
		return outbox.Hooks{
			Polled: func(outbox.Poll) {
				mu.Lock()
				claimedAt = time.Now()
				if cycleStart.IsZero() {
					cycleStart = start
				}
				mu.Unlock()
			},
			BatchDone: func(b outbox.BatchResult) {
				now := time.Now()
				mu.Lock()
				claims = append(claims, claimedAt.Sub(cycleStart))
				publishes = append(publishes, b.ConfirmedAt.Sub(claimedAt))
				finishes = append(finishes, now.Sub(b.ConfirmedAt))
				cycleStart = now
				mu.Unlock()
				if published.Add(int64(len(b.Published))) >= int64(rows) {
					doneOnce.Do(func() { close(done) })
				}
			},
		}
	}
	type instance struct {
		pool  *pgxpool.Pool
		pub   *outboxrabbitmq.Publisher
		relay *outbox.Relay
	}
	instances := make([]instance, relays)
	defer func() {
		for _, in := range instances {
			if in.pub != nil {
				_ = in.pub.Close()
			}
			if in.pool != nil {
				in.pool.Close()
			}
		}
	}()
	for i := range instances {
		url, err := withAppName(dbURL, fmt.Sprintf("%s%d", appName, i))
		if err != nil {
			return DrainResult{}, err
		}
		// A connection per batch in flight and one for maintenance (outbox.Relay.PoolSize).
		pool, err := openPool(ctx, url, int32(1+inFlight))
		if err != nil {
			return DrainResult{}, err
		}
		instances[i].pool = pool
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: e.cfg.AMQPURL, ConnectionName: fmt.Sprintf("bench-%s-relay-%d", e.id, i),
			Connections: inFlight, Logger: e.log})
		if err != nil {
			return DrainResult{}, err
		}
		instances[i].pub = pub
		cfg := outbox.Config{BatchSize: batch, InFlightBatches: inFlight, DisableNotify: true, Logger: e.log, Hooks: hooks()}
		if tracing != TracingOff {
			tp, prop, shutdown := tracing.tracer()
			defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
			cfg.TracerProvider, cfg.Propagator = tp, prop
		}
		r, err := outbox.NewRelay(pool, pub, cfg)
		if err != nil {
			return DrainResult{}, err
		}
		instances[i].relay = r
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	meter := e.startCPU(ctx, appName)
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	for _, in := range instances {
		wg.Go(func() { _ = in.relay.Run(runCtx) })
	}
	var elapsed time.Duration
	select {
	case <-done:
		elapsed = time.Since(start)
	case <-ctx.Done():
	case <-time.After(drainTimeout(rows)):
	}
	cpu := meter.stop(ctx, rows)
	stop()
	wg.Wait()
	if elapsed == 0 {
		return DrainResult{}, errors.Join(ctx.Err(), fmt.Errorf("drained %d of %d rows within %s", published.Load(), rows, drainTimeout(rows)))
	}
	if got, _, err := snk.waitFor(ctx, int64(rows), 30*time.Second); err != nil {
		return DrainResult{}, fmt.Errorf("relays marked %d rows published but the queue received %d: %w", published.Load(), got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	tenth := max(len(claims)/10, 1)
	return DrainResult{
		Rate: float64(rows) / elapsed.Seconds(), Cycles: len(claims),
		Claim: Median(claims), Publish: Median(publishes), Finish: Median(finishes),
		FirstClaims: Median(claims[:tenth]), LastClaims: Median(claims[len(claims)-tenth:]),
		CPU: cpu,
	}, nil
}

// DrainResult is one drain of item 3.
type DrainResult struct {
	Rate float64
	// Cycles is the number of relay cycles; Claim, Publish and Finish the medians of their
	// steps: BEGIN + claim, publish until the last confirm, mark + COMMIT.
	Cycles                 int
	Claim, Publish, Finish time.Duration
	// FirstClaims and LastClaims are the median claims of the first and the last tenth of
	// the cycles: a claim that slows down as the backlog drains shows here.
	FirstClaims, LastClaims time.Duration
	// CPU is what the relays, their PostgreSQL backends and the broker spent on the drain.
	CPU *CPUUsage
}

// drainTimeout bounds a drain: 200 rows/s at the least, plus a minute.
func drainTimeout(rows int) time.Duration {
	return time.Minute + time.Duration(rows/200)*time.Second
}

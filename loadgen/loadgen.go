package loadgen

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Run places orders as cfg says until Count orders were placed, Duration passed, Stop was
// closed or ctx is cancelled, waits for the orders in flight, and returns what happened. Its error is only for
// a bad Config: failed requests are counted in [Result.Errors].
//
// After ctx is cancelled no new order is placed, and the orders in flight get as long as one
// request may take (the client's Timeout, 10s by default) to finish, retries included; what is
// still running then is abandoned and counted as "interrupted". When Count or Duration ends
// the run, or Stop, the orders in flight finish, retries included (RetryFor bounds them).
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return Result{}, err
	}
	r := &runner{cfg: cfg, log: cfg.Logger, client: cfg.Client, seed: cfg.Seed}
	if r.client == nil {
		r.client = newClient(cfg.Concurrency)
		defer r.client.CloseIdleConnections()
	}
	if r.seed == 0 {
		r.seed = rand.Uint64() | 1
	}
	// The backlog that timer jitter and a moment of slowness explain: one order per worker,
	// or 100ms worth of orders. Beyond it the run has fallen behind its rate.
	r.allowance = max(cfg.Concurrency, int(math.Ceil(cfg.Rate/10)))
	return r.run(ctx), nil
}

// runner is one run.
type runner struct {
	cfg       Config
	log       *slog.Logger
	client    *http.Client
	seed      uint64
	allowance int
	start     time.Time

	mu      sync.Mutex // guards what follows
	res     Result
	hist    histogram
	skipped int // schedule slots dropped because every worker was busy
}

func (r *runner) run(ctx context.Context) Result {
	cfg := r.cfg
	r.res = Result{
		Acknowledged: map[string]string{},
		Errors:       map[string]int{},
		rate:         cfg.Rate,
		concurrency:  cfg.Concurrency,
		seed:         r.seed,
		keyPrefix:    cfg.KeyPrefix,
		examples:     map[string]string{},
	}
	r.log.InfoContext(ctx, "loadgen started", "orders_url", cfg.OrdersURL, "rate", cfg.Rate,
		"concurrency", cfg.Concurrency, "duration", cfg.Duration, "count", cfg.Count, "seed", r.seed,
		"key_prefix", cfg.KeyPrefix)

	// Requests run on their own context: a stop ends the placing at once, but the orders in
	// flight get a grace period before abort cancels them.
	work, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()

	r.start = time.Now()
	tickets := make(chan int)
	var workers sync.WaitGroup
	for range cfg.Concurrency {
		workers.Go(func() {
			for n := range tickets {
				r.order(work, n)
			}
		})
	}
	var prog *progress
	if cfg.Progress != nil {
		prog = startProgress(r, cfg.Progress)
	}

	placingEnded := r.dispatch(ctx, tickets)

	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		grace := defaultTimeout
		if r.client.Timeout > 0 {
			grace = r.client.Timeout
		}
		t := time.NewTimer(grace)
		select {
		case <-done:
		case <-t.C:
			r.log.WarnContext(ctx, "orders still in flight after the grace period: abandoning them", "grace", grace)
			abort()
			<-done
		}
		t.Stop()
	}

	r.mu.Lock()
	res := r.res
	res.Elapsed = time.Since(r.start)
	res.Latency = r.hist.percentiles()
	res.latencyCount = r.hist.n
	if cfg.Rate > 0 {
		window := placingEnded.Sub(r.start)
		if cfg.Duration > 0 {
			window = min(window, cfg.Duration)
		}
		res.due = int(math.Ceil(window.Seconds() * cfg.Rate))
		res.behind = r.skipped > 0 || res.due-res.Placed > r.allowance
	}
	r.mu.Unlock()
	if prog != nil {
		prog.stop()
	}
	if res.behind {
		r.log.WarnContext(ctx, "loadgen fell behind its rate", "due", res.due, "placed", res.Placed, "concurrency", cfg.Concurrency)
	}
	r.log.InfoContext(ctx, "loadgen finished", "placed", res.Placed, "acknowledged", len(res.Acknowledged), "errors", res.Errors)
	return res
}

// dispatch hands sequence numbers to the workers until a limit is reached or ctx is done, and
// returns when it stopped placing.
//
// With a Rate, order k (from 0) is due at start + k/Rate: the schedule is fixed, so pacing
// never drifts however long the requests take. When every worker is busy the due orders wait
// and go out as soon as workers free up, up to a backlog of r.allowance; older slots are
// dropped and counted, and the run reports that it fell behind.
func (r *runner) dispatch(ctx context.Context, tickets chan<- int) time.Time {
	defer close(tickets)
	cfg := r.cfg
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(time.Until(r.start.Add(cfg.Duration)))
		defer t.Stop()
		deadline = t.C
	}
	stop := cfg.Stop // nil: never
	slot := func(k int) time.Duration { return time.Duration(float64(k) / cfg.Rate * float64(time.Second)) }
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	k := 0 // the next schedule slot
	for n := 1; cfg.Count == 0 || n <= cfg.Count; n++ {
		if cfg.Rate > 0 {
			at := slot(k)
			if cfg.Duration > 0 && at >= cfg.Duration {
				return time.Now()
			}
			if wait := time.Until(r.start.Add(at)); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return time.Now()
				case <-deadline:
					return time.Now()
				case <-stop:
					return time.Now()
				}
			}
		}
		select {
		case tickets <- n:
		case <-ctx.Done():
			return time.Now()
		case <-deadline:
			return time.Now()
		case <-stop:
			return time.Now()
		}
		r.mu.Lock()
		r.res.Placed++
		r.mu.Unlock()
		k++
		if cfg.Rate > 0 {
			// Slots 0..due-1 are due by now; k..due-1 wait for a worker.
			due := int(time.Since(r.start).Seconds()*cfg.Rate) + 1
			if backlog := due - k; backlog > r.allowance {
				skip := backlog - r.allowance
				k += skip
				r.mu.Lock()
				first := r.skipped == 0
				r.skipped += skip
				r.mu.Unlock()
				if first {
					r.log.WarnContext(ctx, "falling behind the rate: every worker is busy", "rate", cfg.Rate, "concurrency", cfg.Concurrency)
				}
			}
		}
	}
	return time.Now()
}

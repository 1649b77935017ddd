package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxshop/outboxshop/loadgen"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
)

// APIResult is item 7: POST /orders of the orders service at a fixed concurrency.
type APIResult struct {
	Concurrency int
	// Rate is orders answered 201 per second; Latency their response times (loadgen's
	// histogram: p50, p99 and max; no p99.9).
	Rate    float64
	Latency Latencies
	// Failed counts loadgen's errors; FirstFailure names one kind of them.
	Failed       int
	FirstFailure string
	Err          error
}

// api is item 7: the orders service (services/orders/app, mode api: the HTTP API and its
// stock-event consumer) runs in this process on a database of its own, and loadgen places
// orders with conc requests in flight, unpaced, each with a fresh Idempotency-Key: a
// warm-up of up to a second, then d measured. No relay runs: the events stay in the outbox.
func (e *env) api(ctx context.Context, conc int, d time.Duration) APIResult {
	res := APIResult{Concurrency: conc}
	dbURL, err := e.createDatabase(ctx, "api", "")
	if err != nil {
		res.Err = err
		return res
	}
	cfg := ordersapp.DefaultConfig()
	cfg.DatabaseURL, cfg.AMQPURL = dbURL, e.cfg.AMQPURL
	cfg.HTTPAddr, cfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.EventsExchange, cfg.DeadLetterExchange = e.amqpName("api.events"), e.amqpName("api.dlx")
	cfg.Queue, cfg.DeadLetterQueue = e.amqpName("api.stock"), e.amqpName("api.stock.dead")
	// A connection per client, and the consumer's.
	cfg.DatabaseMaxConns = int32(conc + cfg.ConsumerConcurrency + 1)
	e.deleteLater([]string{cfg.EventsExchange, cfg.DeadLetterExchange}, []string{cfg.Queue, cfg.DeadLetterQueue})
	app, err := ordersapp.New(cfg, ordersapp.ModeAPI, ordersapp.Options{Logger: e.log})
	if err != nil {
		res.Err = err
		return res
	}
	if err := app.Start(ctx); err != nil {
		res.Err = fmt.Errorf("start the orders service: %w", err)
		return res
	}
	defer func() {
		if err := app.Stop(); err != nil {
			e.progress("  stopping the orders service: %v", err)
		}
	}()

	run := func(d time.Duration, prefix string) (loadgen.Result, error) {
		return loadgen.Run(ctx, loadgen.Config{
			OrdersURL: app.URL(), Concurrency: conc, Duration: d,
			KeyPrefix: "bench-" + e.id + "-" + prefix + "-", Seed: 42, Logger: e.log,
		})
	}
	if _, err := run(min(time.Second, d/3), "warmup"); err != nil {
		res.Err = err
		return res
	}
	r, err := run(d, "run")
	if err != nil {
		res.Err = err
		return res
	}
	res.Rate = float64(len(r.Acknowledged)) / r.Elapsed.Seconds()
	res.Latency = Latencies{N: len(r.Acknowledged), P50: r.Latency.P50, P99: r.Latency.P99, Max: r.Latency.Max}
	for kind, n := range r.Errors {
		res.Failed += n
		if res.FirstFailure == "" || kind < res.FirstFailure {
			res.FirstFailure = kind
		}
	}
	return res
}

// Package app wires the orders service: it connects to PostgreSQL (creating and migrating the
// database), declares the RabbitMQ topology, and runs the API, the stock-event consumer and the
// outbox relay, in the combinations of the binary's subcommands (Mode), and registers the
// metrics of docs/metrics.md for what the mode runs (service="orders").
//
// Tests start an App on 127.0.0.1:0 in-process:
//
//	cfg := app.DefaultConfig()
//	cfg.DatabaseURL, cfg.AMQPURL, cfg.HTTPAddr = dbURL, amqpURL, "127.0.0.1:0"
//	a, err := app.New(cfg, app.ModeAll, app.Options{Logger: log})
//	err = a.Start(ctx)     // listening when it returns
//	resp, err := http.Get(a.URL() + "/orders/…")
//	err = a.Stop()         // graceful; returns the first error of a component
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/httpserver"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	inboxmetrics "github.com/outboxshop/outboxshop/pkg/inbox/metrics"
	inboxrabbitmq "github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	inboxrabbitmqmetrics "github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq/rabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	outboxmetrics "github.com/outboxshop/outboxshop/pkg/outbox/metrics"
	outboxrabbitmq "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq"
	outboxrabbitmqmetrics "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq/rabbitmqmetrics"
	ordersamqp "github.com/outboxshop/outboxshop/services/orders/amqp"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// Mode selects what an App runs.
type Mode string

const (
	// ModeAPI runs the HTTP API and the consumer of the stock events (`orders api`).
	ModeAPI Mode = "api"
	// ModeRelay runs the outbox relay and its cleanup, with /healthz, /readyz and /metrics on
	// RelayHTTPAddr (`orders relay`).
	ModeRelay Mode = "relay"
	// ModeAll runs everything in one process (`orders all`).
	ModeAll Mode = "all"
)

// FailpointAfterCommit is the API's crash point: the POST /orders transaction committed, the
// answer is not written yet.
const FailpointAfterCommit = "api.after-commit"

// Options are the parts of an App that do not come from the environment.
type Options struct {
	// Logger receives every log line. nil discards.
	Logger *slog.Logger
	// Failpoints are the armed crash points (failpoint.FromEnv). nil arms none.
	Failpoints *failpoint.Set
	// Registry collects the metrics served on /metrics. nil makes a new one with the Go and
	// process collectors. Start registers the service's metrics on it (docs/metrics.md), so
	// one registry serves one App.
	Registry *prometheus.Registry
}

// App is a running (or ready to run) orders service.
type App struct {
	cfg  Config
	mode Mode
	log  *slog.Logger
	fp   *failpoint.Set

	// Registry is what /metrics serves. Add collectors to it before Start.
	Registry *prometheus.Registry

	pool        *pgxpool.Pool
	store       *postgres.Store
	topology    ordersamqp.Topology
	declarer    *amqptopo.Declarer
	checks      []readiness.Check // of /readyz, besides the database
	httpMetrics *ordershttp.Metrics
	apiLn       net.Listener
	opsLn       net.Listener

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	done     chan struct{}
	doneOnce sync.Once
	errMu    sync.Mutex
	err      error
	stopOnce sync.Once
}

// New checks cfg and returns an App that Start runs in mode.
func New(cfg Config, mode Mode, opts Options) (*App, error) {
	switch mode {
	case ModeAPI, ModeRelay, ModeAll:
	default:
		return nil, fmt.Errorf("unknown mode %q (want api, relay or all)", mode)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := opts.Registry
	if reg == nil {
		reg = NewRegistry()
	}
	return &App{
		cfg: cfg, mode: mode, log: log, fp: opts.Failpoints, Registry: reg,
		topology: ordersamqp.Topology{
			Exchange: cfg.EventsExchange, DeadLetterExchange: cfg.DeadLetterExchange,
			Queue: cfg.Queue, DeadQueue: cfg.DeadLetterQueue, DeliveryLimit: cfg.QueueDeliveryLimit,
		}.WithDefaults(),
		done: make(chan struct{}),
	}, nil
}

// NewRegistry returns a metrics registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Migrate creates the database when it does not exist and applies every migration (the
// service's, the outbox's and the inbox's), waiting for a database that is not there yet
// until ctx ends (internal/pgdb). It is the `orders migrate` subcommand; Start does it too.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pool, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	pool.Close()
	log.InfoContext(ctx, "database migrated")
	return nil
}

// openDatabase opens the pool, creating the database if needed, and migrates it. While the
// server cannot be reached it retries with backoff and a log line per attempt until ctx ends;
// it gives up at once only on a configuration error (pgdb.ConfigError).
func openDatabase(ctx context.Context, cfg Config, log *slog.Logger) (*pgxpool.Pool, error) {
	return pgdb.Open(ctx, pgdb.Config{
		URL:            cfg.DatabaseURL,
		MaxConns:       cfg.DatabaseMaxConns,
		ConnectTimeout: cfg.DatabaseTimeout,
		Migrate:        postgres.Migrate,
		Logger:         log,
	})
}

// Start connects to and migrates the database (waiting for it until ctx ends, see
// openDatabase), binds the listeners, and starts the mode's components in the background.
// When it returns nil, Addr and OpsAddr are listening. The components run until ctx is
// cancelled or Stop is called; if one fails, the others are stopped too, Done is closed, and
// Stop returns the error.
func (a *App) Start(ctx context.Context) (err error) {
	a.log.InfoContext(ctx, "orders starting", "mode", a.mode, "failpoints", a.fp.Armed())
	defer func() {
		if err != nil {
			a.closeResources()
		}
	}()
	if a.pool, err = openDatabase(ctx, a.cfg, a.log); err != nil {
		return err
	}
	if a.store, err = postgres.NewStore(a.pool, postgres.StoreConfig{Exchange: a.topology.Exchange}); err != nil {
		return err
	}
	// The consumer and the relay declare the topology on every (re)connect, keeping a queue
	// that exists with other arguments (a changed delivery limit) instead of failing.
	if a.declarer, err = amqptopo.NewDeclarer(a.cfg.AMQPURL, a.topology.Shared(), a.log); err != nil {
		return err
	}
	// The metrics of every mode: the pool's statistics and the HTTP requests of whichever
	// router this process serves (the API, or the relay's ops port).
	if err := a.Registry.Register(pgxpoolmetrics.New(a.pool, constLabels())); err != nil {
		return fmt.Errorf("register pool metrics: %w", err)
	}
	if a.httpMetrics, err = ordershttp.NewMetrics(a.Registry, constLabels()); err != nil {
		return fmt.Errorf("register HTTP metrics: %w", err)
	}
	var lc net.ListenConfig
	if a.mode == ModeAPI || a.mode == ModeAll {
		if a.apiLn, err = lc.Listen(ctx, "tcp", a.cfg.HTTPAddr); err != nil {
			return fmt.Errorf("listen on %s: %w", a.cfg.HTTPAddr, err)
		}
	}
	if a.mode == ModeRelay {
		if a.opsLn, err = lc.Listen(ctx, "tcp", a.cfg.RelayHTTPAddr); err != nil {
			return fmt.Errorf("listen on %s: %w", a.cfg.RelayHTTPAddr, err)
		}
	}

	// Everything is built before anything runs, so that a configuration error leaves nothing
	// behind.
	// The relay's are built first, so that in ModeAll the API's /readyz checks the relay too.
	var components []component
	if a.mode == ModeRelay || a.mode == ModeAll {
		c, err := a.relayComponents()
		if err != nil {
			return err
		}
		components = append(components, c...)
	}
	if a.apiLn != nil {
		c, err := a.apiComponents()
		if err != nil {
			return err
		}
		components = append(components, c...)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	go func() { // the caller's ctx stops the App too
		select {
		case <-ctx.Done():
			cancel()
		case <-runCtx.Done():
		}
	}()
	for _, c := range components {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			if err := c.run(runCtx); err != nil {
				a.fail(fmt.Errorf("%s: %w", c.name, err))
			}
		}()
	}
	a.log.InfoContext(ctx, "orders started", "mode", a.mode, "http_addr", a.Addr(), "ops_addr", a.OpsAddr())
	return nil
}

// component is one long-running part of the App.
type component struct {
	name string
	run  func(ctx context.Context) error
}

func (a *App) apiComponents() ([]component, error) {
	svc, err := newServiceMetrics(a.Registry)
	if err != nil {
		return nil, fmt.Errorf("register service metrics: %w", err)
	}
	// The backlog of the outbox table, read here and not by the relay, so that it stays
	// visible when the relay is down.
	stats, err := outboxmetrics.NewStats(a.Registry, a.pool, outboxmetrics.StatsConfig{ConstLabels: constLabels(), Logger: a.log})
	if err != nil {
		return nil, fmt.Errorf("register outbox stats metrics: %w", err)
	}
	consumerMetrics, err := inboxrabbitmqmetrics.NewConsumer(a.Registry, inboxrabbitmqmetrics.Config{KnownTypes: consumedTypes, ConstLabels: constLabels()})
	if err != nil {
		return nil, fmt.Errorf("register consumer metrics: %w", err)
	}
	consumerMetrics.Init(ordersamqp.ConsumerName)
	window, err := inboxmetrics.NewWindow(a.Registry, constLabels())
	if err != nil {
		return nil, fmt.Errorf("register inbox window metrics: %w", err)
	}
	window.Set(ordersamqp.ConsumerName, a.cfg.InboxRetention, redeliveryWindow(a.cfg))

	// /readyz: the database, and the consumer's broker connection, which may be away for
	// BrokerDownGrace (a broker restart) before the process counts as not ready.
	consumerLink := readiness.NewLink("not connected to the broker yet")
	a.checks = append(a.checks, readiness.Check{Name: "consumer", Check: readiness.Connection(consumerLink, a.cfg.BrokerDownGrace)})
	api := ordershttp.NewHandler(ordershttp.Config{
		Checks:   a.checks,
		Orders:   a.store,
		Gatherer: a.Registry,
		Metrics:  a.httpMetrics,
		Logger:   a.log,
		AfterCommit: func() {
			svc.created.Inc()
			a.fp.Hit(FailpointAfterCommit)
		},
		DatabaseTimeout: a.cfg.DatabaseTimeout,
	})
	// The pool is wrapped so that countingApplier counts an outcome after its inbox
	// transaction committed.
	consumer, err := inboxrabbitmq.NewConsumer(aftercommit.Wrap(a.pool), inboxrabbitmq.Config{
		URL:                  a.cfg.AMQPURL,
		Queue:                a.topology.Queue,
		Name:                 ordersamqp.ConsumerName,
		Handler:              ordersamqp.NewHandler(countingApplier{StockApplier: a.store, outcomes: svc.outcomes}, a.log),
		Prefetch:             a.cfg.ConsumerPrefetch,
		Concurrency:          a.cfg.ConsumerConcurrency,
		MaxDeliveries:        a.cfg.ConsumerMaxDeliveries,
		RetryDelay:           a.cfg.ConsumerRetryDelay,
		MaxRetryDelay:        a.cfg.ConsumerMaxRetryDelay,
		MaxHold:              a.cfg.ConsumerMaxHold,
		ShutdownTimeout:      a.cfg.ConsumerShutdownTimeout,
		DeadLetterExchange:   a.topology.DeadLetterExchange,
		DeadLetterRoutingKey: a.topology.Queue,
		Setup:                a.declarer.Setup,
		Logger:               a.log,
		Hooks: consumerMetrics.Hooks(inboxrabbitmq.Hooks{
			Failpoint: failpoint.Hook(a.fp, func(h inboxrabbitmq.FailpointHit) string { return h.Name }),
			Connected: readiness.ConsumerConnected(consumerLink),
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("stock consumer: %w", err)
	}
	consumerMetrics.SetPoolSize(ordersamqp.ConsumerName, consumer.PoolSize())
	return []component{
		{"http server", func(ctx context.Context) error {
			return httpserver.Serve(ctx, a.apiLn, api, httpserver.Config{ShutdownTimeout: a.cfg.HTTPShutdownTimeout}, a.log)
		}},
		{"stock consumer", consumer.Run},
		{"inbox cleanup", func(ctx context.Context) error {
			return inbox.RunCleanup(ctx, a.pool, inbox.CleanupConfig{
				Retention: a.cfg.InboxRetention, Interval: a.cfg.InboxCleanupInterval, Logger: a.log,
			})
		}},
		{"idempotency key cleanup", a.runIdempotencyCleanup},
		{"outbox stats", stats.Run},
	}, nil
}

func (a *App) relayComponents() ([]component, error) {
	relayMetrics, err := outboxmetrics.NewRelay(a.Registry, constLabels())
	if err != nil {
		return nil, fmt.Errorf("register relay metrics: %w", err)
	}
	publisherMetrics, err := outboxrabbitmqmetrics.NewPublisher(a.Registry, constLabels())
	if err != nil {
		return nil, fmt.Errorf("register publisher metrics: %w", err)
	}
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URL:            a.cfg.AMQPURL,
		ConnectionName: "orders-relay",
		DialTimeout:    a.cfg.DatabaseTimeout,
		Setup:          a.declarer.Setup,
		Logger:         a.log,
		Hooks:          publisherMetrics.Hooks(outboxrabbitmq.Hooks{}),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox publisher: %w", err)
	}
	// /readyz: the relay may be cut off from the broker (or the database) for
	// BrokerDownGrace before the process counts as not ready. An idle relay does not try
	// the broker, so it notices an outage with the next message it has to publish.
	relayLink := readiness.NewLink("starting")
	a.checks = append(a.checks, readiness.Check{Name: "relay", Check: readiness.Connection(relayLink, a.cfg.BrokerDownGrace)})
	relay, err := outbox.NewRelay(a.pool, pub, outbox.Config{
		BatchSize:       a.cfg.RelayBatchSize,
		PollInterval:    a.cfg.RelayPollInterval,
		MaxAttempts:     a.cfg.RelayMaxAttempts,
		PublishTimeout:  a.cfg.RelayPublishTimeout,
		ClaimTimeout:    a.cfg.RelayClaimTimeout,
		MaxMessageBytes: a.cfg.RelayMaxMessageBytes,
		RetryBaseDelay:  relayRetryBaseDelay,
		RetryMaxDelay:   relayRetryMaxDelay,
		Logger:          a.log,
		Hooks:           relayMetrics.Hooks(outbox.Hooks{Failpoint: failpoint.Hook(a.fp, func(h outbox.FailpointHit) string { return h.Name }), StateChanged: readiness.RelayState(relayLink)}),
	})
	if err != nil {
		_ = pub.Close()
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	relayMetrics.SetPoolSize(relay.PoolSize())
	cs := []component{
		{"outbox relay", func(ctx context.Context) error {
			defer pub.Close() //nolint:errcheck // the relay is done with it
			return relay.Run(ctx)
		}},
		{"outbox cleanup", func(ctx context.Context) error {
			return outbox.RunCleanup(ctx, a.pool, outbox.CleanupConfig{
				Retention: a.cfg.OutboxRetention, Interval: a.cfg.OutboxCleanupInterval, Logger: a.log,
			})
		}},
	}
	if a.opsLn != nil {
		checks := append([]readiness.Check{{Name: "database", Check: readiness.Ping(a.store.Ping)}}, a.checks...)
		ops := ordershttp.NewOpsHandler(ordershttp.OpsConfig{
			Gatherer: a.Registry, Metrics: a.httpMetrics, Checks: checks, Logger: a.log,
		})
		cs = append(cs, component{"relay http server", func(ctx context.Context) error {
			return httpserver.Serve(ctx, a.opsLn, ops, httpserver.Config{ShutdownTimeout: a.cfg.HTTPShutdownTimeout}, a.log)
		}})
	}
	return cs, nil
}

// runIdempotencyCleanup deletes expired idempotency keys every interval until ctx ends.
func (a *App) runIdempotencyCleanup(ctx context.Context) error {
	t := time.NewTicker(a.cfg.IdempotencyKeyCleanupInterval)
	defer t.Stop()
	for {
		n, err := a.store.CleanupIdempotencyKeys(ctx, a.cfg.IdempotencyKeyRetention, 1000)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			a.log.WarnContext(ctx, "idempotency key cleanup failed", "error", err)
		case n > 0:
			a.log.InfoContext(ctx, "idempotency keys deleted", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// fail records the first component error and stops the others.
func (a *App) fail(err error) {
	a.errMu.Lock()
	if a.err == nil {
		a.err = err
		a.log.Error("component failed, stopping", "error", err)
	}
	a.errMu.Unlock()
	a.cancel()
	a.doneOnce.Do(func() { close(a.done) })
}

// Done is closed when a component failed (Stop then returns its error). It is not closed by
// a graceful stop.
func (a *App) Done() <-chan struct{} { return a.done }

// Addr is the API's address ("127.0.0.1:port"), or "" when the mode serves no API.
func (a *App) Addr() string {
	if a.apiLn == nil {
		return ""
	}
	return a.apiLn.Addr().String()
}

// URL is the API's base URL, e.g. http://127.0.0.1:43127.
func (a *App) URL() string { return "http://" + a.Addr() }

// OpsAddr is where the relay process serves /healthz, /readyz and /metrics ("" in the other
// modes, whose API serves them).
func (a *App) OpsAddr() string {
	if a.opsLn == nil {
		return ""
	}
	return a.opsLn.Addr().String()
}

// Pool is the App's database pool (nil before Start).
func (a *App) Pool() *pgxpool.Pool { return a.pool }

// Stop stops every component gracefully (in-flight requests finish, the consumer acknowledges
// what it handled, the relay finishes its batch), closes the pool, and returns the first
// error a component failed with. It may be called more than once.
func (a *App) Stop() error {
	a.stopOnce.Do(func() {
		if a.cancel != nil {
			a.cancel()
		}
		a.wg.Wait()
		a.closeResources()
		a.log.Info("orders stopped", "mode", a.mode)
	})
	a.errMu.Lock()
	defer a.errMu.Unlock()
	return a.err
}

func (a *App) closeResources() {
	for _, ln := range []net.Listener{a.apiLn, a.opsLn} {
		if ln != nil {
			_ = ln.Close() // already closed by the server when it ran
		}
	}
	if a.pool != nil {
		a.pool.Close()
	}
}

// Run starts the App and runs it until ctx is cancelled or a component fails, then stops it.
// A ctx cancelled while Start still waits for the database is a graceful stop too.
func (a *App) Run(ctx context.Context) error {
	if err := a.Start(ctx); err != nil {
		if ctx.Err() != nil {
			a.log.InfoContext(ctx, "orders stopped before it started", "mode", a.mode, "error", err)
			return nil
		}
		return err
	}
	select {
	case <-ctx.Done():
	case <-a.done:
	}
	return a.Stop()
}

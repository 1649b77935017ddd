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
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/service"
	inboxmetrics "github.com/outboxshop/outboxshop/pkg/inbox/metrics"
	inboxrabbitmq "github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	outboxrabbitmq "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq"
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

// App is a running (or ready to run) orders service: the components of its mode in one
// internal/service Group.
type App struct {
	cfg  Config
	mode Mode
	log  *slog.Logger
	fp   *failpoint.Set

	// Registry is what /metrics serves. Add collectors to it before Start.
	Registry *prometheus.Registry

	group    *service.Group
	pool     *pgxpool.Pool
	store    *postgres.Store
	topology ordersamqp.Topology
	declarer *amqptopo.Declarer
	checks   []readiness.Check // of /readyz, besides the database
	httpm    *ordershttp.Metrics
	apiLn    net.Listener
	opsLn    net.Listener
}

// New checks cfg and returns an App that Start runs in mode.
func New(cfg Config, mode Mode, opts Options) (*App, error) {
	switch mode {
	case ModeAPI, ModeRelay, ModeAll:
	default:
		return nil, fmt.Errorf("unknown mode %q (want api, relay or all)", mode)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	return &App{
		cfg: cfg, mode: mode, log: log, fp: opts.Failpoints,
		Registry: cmp.Or(opts.Registry, service.NewRegistry()),
		group:    service.NewGroup("orders", log.With("mode", mode)),
		topology: ordersamqp.Topology{
			Exchange: cfg.EventsExchange, DeadLetterExchange: cfg.DeadLetterExchange,
			Queue: cfg.Queue, DeadQueue: cfg.DeadLetterQueue, DeliveryLimit: cfg.QueueDeliveryLimit,
		}.WithDefaults(),
	}, nil
}

// Migrate creates the database when it does not exist and applies every migration (the
// service's, the outbox's and the inbox's), waiting for a database that is not there yet
// until ctx ends (internal/pgdb). It is the `orders migrate` subcommand; Start does it too.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
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
// Stop returns the error. After an error, Stop releases what Start had acquired.
func (a *App) Start(ctx context.Context) (err error) {
	a.log.InfoContext(ctx, "orders starting", "mode", a.mode, "failpoints", a.fp.Armed())
	defer func() {
		if err != nil {
			_ = a.group.Stop() // releases what was acquired; nothing ran
		}
	}()
	if a.pool, err = openDatabase(ctx, a.cfg, a.log); err != nil {
		return err
	}
	a.group.OnStop(a.pool.Close)
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
	if a.httpm, err = ordershttp.NewMetrics(a.Registry, constLabels()); err != nil {
		return fmt.Errorf("register HTTP metrics: %w", err)
	}
	if a.mode == ModeAPI || a.mode == ModeAll {
		if a.apiLn, err = service.Listen(ctx, a.group, a.cfg.HTTPAddr); err != nil {
			return err
		}
	}
	if a.mode == ModeRelay {
		if a.opsLn, err = service.Listen(ctx, a.group, a.cfg.RelayHTTPAddr); err != nil {
			return err
		}
	}
	// Everything is built before anything runs, so that a configuration error leaves nothing
	// behind. The relay's are built first, so that in ModeAll the API's /readyz checks the
	// relay too.
	if a.mode == ModeRelay || a.mode == ModeAll {
		if err := a.addRelay(); err != nil {
			return err
		}
	}
	if a.apiLn != nil {
		if err := a.addAPI(); err != nil {
			return err
		}
	}
	a.group.Start(ctx)
	a.log.InfoContext(ctx, "orders started", "mode", a.mode, "http_addr", a.Addr(), "ops_addr", a.OpsAddr())
	return nil
}

func (a *App) addAPI() error {
	svc, err := newServiceMetrics(a.Registry)
	if err != nil {
		return fmt.Errorf("register service metrics: %w", err)
	}
	if err := service.AddOutboxStats(a.group, a.Registry, a.pool, constLabels(), a.log); err != nil {
		return err
	}
	consumerMetrics, err := inboxmetrics.NewConsumer(a.Registry, inboxmetrics.Config{KnownTypes: consumedTypes, ConstLabels: constLabels()})
	if err != nil {
		return fmt.Errorf("register consumer metrics: %w", err)
	}
	consumerMetrics.Init(ordersamqp.ConsumerName)
	consumerMetrics.SetWindow(ordersamqp.ConsumerName, a.cfg.InboxRetention, redeliveryWindow(a.cfg))

	// /readyz: the database, and the consumer's broker connection, which may be away for
	// BrokerDownGrace (a broker restart) before the process counts as not ready.
	consumerLink := readiness.NewLink("not connected to the broker yet")
	a.checks = append(a.checks, readiness.Check{Name: "consumer", Check: readiness.Connection(consumerLink, a.cfg.BrokerDownGrace)})
	api := ordershttp.NewHandler(ordershttp.Config{
		Checks:   a.checks,
		Orders:   a.store,
		Gatherer: a.Registry,
		Metrics:  a.httpm,
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
			Failpoint: a.fp.Func(),
			Connected: readiness.ConsumerConnected(consumerLink),
		}),
	})
	if err != nil {
		return fmt.Errorf("stock consumer: %w", err)
	}
	service.AddServer(a.group, "http server", a.apiLn, api, a.cfg.HTTPShutdownTimeout, a.log)
	a.group.Add("stock consumer", consumer.Run)
	service.AddInboxCleanup(a.group, a.pool, a.cfg.InboxRetention, a.cfg.InboxCleanupInterval, a.log)
	a.group.Add("idempotency key cleanup", func(ctx context.Context) error {
		return service.Every(ctx, a.cfg.IdempotencyKeyCleanupInterval, a.cleanupIdempotencyKeys)
	})
	return nil
}

func (a *App) addRelay() error {
	check, err := service.AddRelay(a.group, service.RelayConfig{
		Pool: a.pool,
		Publisher: outboxrabbitmq.Config{
			URL: a.cfg.AMQPURL, ConnectionName: "orders-relay", DialTimeout: a.cfg.DatabaseTimeout, Setup: a.declarer.Setup,
		},
		Settings:        a.cfg.relaySettings(),
		Retention:       a.cfg.OutboxRetention,
		CleanupInterval: a.cfg.OutboxCleanupInterval,
		BrokerDownGrace: a.cfg.BrokerDownGrace,
		Registry:        a.Registry,
		ConstLabels:     constLabels(),
		Failpoint:       a.fp.Func(),
		Logger:          a.log,
	})
	if err != nil {
		return err
	}
	a.checks = append(a.checks, check)
	if a.opsLn != nil {
		checks := append([]readiness.Check{{Name: "database", Check: readiness.Ping(a.store.Ping)}}, a.checks...)
		ops := ordershttp.NewOpsHandler(ordershttp.OpsConfig{
			Gatherer: a.Registry, Metrics: a.httpm, Checks: checks, Logger: a.log,
		})
		service.AddServer(a.group, "relay http server", a.opsLn, ops, a.cfg.HTTPShutdownTimeout, a.log)
	}
	return nil
}

// cleanupIdempotencyKeys deletes a batch of expired idempotency keys, logging what it did.
func (a *App) cleanupIdempotencyKeys(ctx context.Context) {
	n, err := a.store.CleanupIdempotencyKeys(ctx, a.cfg.IdempotencyKeyRetention, 1000)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		a.log.WarnContext(ctx, "idempotency key cleanup failed", "error", err)
	case n > 0:
		a.log.InfoContext(ctx, "idempotency keys deleted", "deleted", n)
	}
}

// Done is closed when the App has stopped: after Stop, the cancellation of Start's ctx, or
// the failure of a component (Stop and Wait then return its error).
func (a *App) Done() <-chan struct{} { return a.group.Done() }

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
func (a *App) Stop() error { return a.group.Stop() }

// Wait blocks until the App has stopped and returns the first error a component failed
// with, or nil after a graceful stop.
func (a *App) Wait() error { return a.group.Wait() }

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
	return a.Wait()
}

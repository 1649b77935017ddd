// Package app wires the orders service: it connects to PostgreSQL (creating and migrating the
// database), declares the RabbitMQ topology, and runs the API, the stock-event consumer and the
// outbox relay, in the combinations of the binary's subcommands (Mode), and registers the
// metrics of docs/metrics.md for what the mode runs (service="orders"). The lifecycle is
// internal/service's (an App is a service.Process), and so is the command line: cmd/orders
// runs [Command], which parses the configuration and hands off to [App.Run]. This package
// says which components a mode runs, with which settings.
//
// Tests start an App on 127.0.0.1:0 in-process:
//
//	cfg := app.DefaultConfig()
//	cfg.DatabaseURL, cfg.AMQPURL, cfg.HTTPAddr = dbURL, amqpURL, "127.0.0.1:0"
//	a, err := app.New(cfg, app.ModeAll, app.Options{Logger: log})
//	err = a.Start(ctx)  // listening when it returns
//	resp, err := http.Get(a.URL() + "/orders/…")
//	err = a.Stop()      // graceful; the first error of a component
package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
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
	// RelayHTTPAddr (`orders relay`). ModeAPI and ModeAll serve them on the API's address, or
	// on OpsAddr when it is set (the API's then keeps /healthz and /readyz, not /metrics).
	ModeRelay Mode = "relay"
	// ModeAll runs everything in one process (`orders all`).
	ModeAll Mode = "all"
)

// FailpointAfterCommit is the API's crash point: the POST /orders transaction committed, the
// answer is not written yet.
const FailpointAfterCommit = "api.after-commit"

// The store is what the consumer's handler needs of it.
var _ ordersamqp.StockApplier = (*postgres.Store)(nil)

// Options are the parts of an App that do not come from the environment (internal/service).
type Options = service.Options

// App is a running (or ready to run) orders service: a service.Process (Registry, Stop,
// Wait, Done, Pool) whose Start builds the components of its mode.
type App struct {
	*service.Process
	cfg  Config
	mode Mode

	store    *postgres.Store
	topology ordersamqp.Topology
	declarer *amqptopo.Declarer
	// brokerTLS is the TLS configuration of amqps:// URLs, nil without TLS settings.
	brokerTLS *tls.Config
	checks    []readiness.Check       // of /readyz, besides the database
	consumer  *inboxrabbitmq.Consumer // nil in ModeRelay
	httpm     *ordershttp.Metrics
	http      service.Listeners // the API's and the operations routes' (internal/service)
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
	return &App{
		Process: service.NewProcess(ServiceName, string(mode), opts),
		cfg:     cfg, mode: mode,
		topology: ordersamqp.Topology(cfg.Names(cfg.Queue, cfg.DeadLetterQueue)).WithDefaults(),
	}, nil
}

// database is the pgdb configuration of cfg: the service's database, its migrations.
func database(cfg Config) pgdb.Config {
	return pgdb.Config{URL: cfg.DatabaseURL, TLS: cfg.DatabaseTLSFiles(), Setting: "ORDERS_DATABASE_", MaxConns: cfg.DatabaseMaxConns, ConnectTimeout: cfg.DatabaseTimeout, Migrate: postgres.Migrate}
}

// Migrate creates the database when it does not exist and applies every migration (the
// service's, the outbox's and the inbox's), waiting for a database that is not there yet
// until ctx ends (internal/pgdb). It is the `orders migrate` subcommand; Start does it too.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	return pgdb.Migrate(ctx, database(cfg), log)
}

// Start connects to and migrates the database (waiting for it until ctx ends), binds the
// listeners, and starts the mode's components in the background. When it returns nil, Addr
// and OpsAddr are listening. The components run until ctx is cancelled or Stop is called; if
// one fails, the others are stopped too, Done is closed, and Stop returns the error. After an
// error, Stop releases what Start had acquired.
func (a *App) Start(ctx context.Context) (err error) {
	defer a.StopOnError(&err)
	a.Log.InfoContext(ctx, "orders starting")
	pool, err := a.OpenDatabase(ctx, database(a.cfg))
	if err != nil {
		return err
	}
	if a.store, err = postgres.NewStore(pool, postgres.StoreConfig{Exchange: a.topology.Exchange,
		OrderCreatedVersion: a.cfg.OrderCreatedVersion, Propagator: a.Propagator}); err != nil {
		return err
	}
	// The consumer and the relay declare the topology on every (re)connect, keeping a queue
	// that exists with other arguments (a changed delivery limit) instead of failing.
	// A broker whose certificate the TLS settings refuse stops the start, naming them.
	if a.brokerTLS, err = service.BrokerTLS(ctx, a.cfg.BrokerEnv, "ORDERS_"); err != nil {
		return err
	}
	if a.declarer, err = amqptopo.NewDeclarer(a.cfg.AMQPURLs(), a.brokerTLS, a.topology.Shared(), a.Log); err != nil {
		return err
	}
	// The HTTP requests of whichever routers this process serves (the API, the operations
	// port).
	if a.httpm, err = ordershttp.NewMetrics(a.Registry, a.ConstLabels()); err != nil {
		return fmt.Errorf("register HTTP metrics: %w", err)
	}
	// The API on ORDERS_HTTP_ADDR and, when set, the operations routes on ORDERS_OPS_ADDR;
	// the relay's operations routes on ORDERS_RELAY_HTTP_ADDR.
	if a.http, err = service.ListenHTTP(ctx, a.Process, a.mode != ModeRelay,
		service.HTTPAddrs{API: a.cfg.HTTPAddr, Ops: a.cfg.OpsAddr, Relay: a.cfg.RelayHTTPAddr}); err != nil {
		return err
	}
	// Everything is built before anything runs, so that a configuration error leaves nothing
	// behind. The relay's are built first, so that in ModeAll the API's /readyz checks the
	// relay too.
	if a.mode == ModeRelay || a.mode == ModeAll {
		if err := a.addRelay(); err != nil {
			return err
		}
	}
	if a.http.API != nil {
		if err := a.addAPI(); err != nil {
			return err
		}
	}
	if a.http.Ops != nil {
		// After the API's and the relay's, so that /readyz checks whatever the process runs.
		checks := append([]readiness.Check{{Name: "database", Check: readiness.Ping(a.store.Ping)}}, a.checks...)
		ops := ordershttp.NewOpsHandler(ordershttp.OpsConfig{
			Gatherer: a.Registry, Metrics: a.httpm, Checks: checks, Logger: a.Log,
		})
		service.AddServer(a.Process, "ops http server", a.http.Ops, ops, a.cfg.HTTPShutdownTimeout)
	}
	a.Launch(ctx, "http_addr", a.Addr(), "ops_addr", a.OpsAddr())
	return nil
}

func (a *App) addAPI() error {
	svc, err := newServiceMetrics(a.Process)
	if err != nil {
		return fmt.Errorf("register service metrics: %w", err)
	}
	if err := service.AddOutboxStats(a.Process); err != nil {
		return err
	}
	// /readyz: the database, and the consumer, which may be cut off from the broker for
	// BrokerDownGrace (a broker restart) before the process counts as not ready.
	var check readiness.Check
	a.consumer, check, err = service.AddConsumer(a.Process, service.ConsumerConfig{
		Consumer: inboxrabbitmq.Config{
			URLs:                 a.cfg.AMQPURLs(),
			TLSClientConfig:      a.brokerTLS,
			Queue:                a.topology.Queue,
			Name:                 ordersamqp.ConsumerName,
			Handler:              ordersamqp.NewHandler(countingApplier{StockApplier: a.store, outcomes: svc.outcomes}, a.Log),
			ShutdownTimeout:      a.cfg.ConsumerShutdownTimeout,
			DeadLetterExchange:   a.topology.DeadLetterExchange,
			DeadLetterRoutingKey: a.topology.Queue,
			Setup:                a.declarer.Setup,
		},
		Settings:         envconfig.Section[service.ConsumerSettings](a.cfg, "Consumer"),
		KnownTypes:       consumedTypes,
		Retention:        a.cfg.InboxRetention,
		CleanupInterval:  a.cfg.InboxCleanupInterval,
		RelayMaxAttempts: a.cfg.RelayMaxAttempts,
		BrokerDownGrace:  a.cfg.BrokerDownGrace,
	})
	if err != nil {
		return err
	}
	a.checks = append(a.checks, check)
	api := ordershttp.NewHandler(ordershttp.Config{
		Checks:   a.checks,
		Ops:      a.http.APIOps(),
		Orders:   a.store,
		Gatherer: a.Registry,
		Metrics:  a.httpm,
		Logger:   a.Log,
		AfterCommit: func() {
			svc.created.Inc()
			a.Failpoints.Hit(FailpointAfterCommit)
		},
		DatabaseTimeout: a.cfg.DatabaseTimeout,
		TracerProvider:  a.TracerProvider,
		Propagator:      a.Propagator,
	})
	service.AddServer(a.Process, "http server", a.http.API, api, a.cfg.HTTPShutdownTimeout)
	// Every ORDERS_IDEMPOTENCY_KEY_CLEANUP_INTERVAL; after a failed run it backs off from
	// 100ms to 10s (never longer than the interval) and logs the failure once (service.Every).
	service.AddJob(a.Process, service.Job{
		Name: "idempotency key cleanup", Interval: a.cfg.IdempotencyKeyCleanupInterval, Run: a.cleanupIdempotencyKeys,
	})
	return nil
}

func (a *App) addRelay() error {
	check, err := service.AddRelay(a.Process, service.RelayConfig{
		Publisher: outboxrabbitmq.Config{
			URLs: a.cfg.AMQPURLs(), TLSClientConfig: a.brokerTLS, ConnectionName: "orders-relay", DialTimeout: a.cfg.DatabaseTimeout, Setup: a.declarer.Setup,
		},
		Settings:        envconfig.Section[service.RelaySettings](a.cfg, "Relay"),
		Retention:       a.cfg.OutboxRetention,
		CleanupInterval: a.cfg.OutboxCleanupInterval,
		BrokerDownGrace: a.cfg.BrokerDownGrace,
	})
	if err != nil {
		return err
	}
	a.checks = append(a.checks, check)
	return nil
}

// cleanupIdempotencyKeys deletes the expired idempotency keys, in batches of 1000, logging
// how many; it returns a failure for service.Every to log and back off from.
func (a *App) cleanupIdempotencyKeys(ctx context.Context) error {
	n, err := a.store.CleanupIdempotencyKeys(ctx, a.cfg.IdempotencyKeyRetention, 1000)
	if n > 0 {
		a.Log.InfoContext(ctx, "idempotency keys deleted", "deleted", n)
	}
	return err
}

// Consuming reports whether the stock consumer consumes on a live broker connection (false in
// ModeRelay, and before Start).
func (a *App) Consuming() bool { return a.consumer != nil && a.consumer.Connected() }

// Addr is the API's address ("127.0.0.1:port"), or "" when the mode serves no API.
func (a *App) Addr() string { return a.http.APIAddr() }

// URL is the API's base URL, e.g. http://127.0.0.1:43127.
func (a *App) URL() string { return "http://" + a.Addr() }

// OpsAddr is where the process serves /healthz, /readyz and /metrics on a listener of their
// own: the relay's (ORDERS_RELAY_HTTP_ADDR), or the api and all processes' when
// ORDERS_OPS_ADDR is set; "" when the API serves them.
func (a *App) OpsAddr() string { return a.http.OpsAddr() }

// Run starts the App and runs it until ctx is cancelled or a component fails, then stops it.
// A ctx cancelled while Start still waits for the database is a graceful stop too.
func (a *App) Run(ctx context.Context) error { return a.Process.Run(ctx, a.Start) }

// Package app wires the warehouse: configuration, database, broker, HTTP, consumer and relay,
// and the metrics of docs/metrics.md for what each mode runs (service="warehouse"), as
// components of one internal/service Group.
//
// cmd/warehouse parses the configuration and hands off to [App.Run]; tests start an App on
// 127.0.0.1:0 in-process:
//
//	cfg := app.DefaultConfig()
//	cfg.DatabaseURL, cfg.AMQPURL, cfg.HTTPAddr = dbURL, amqpURL, "127.0.0.1:0"
//	a, err := app.New(cfg, app.ModeAll, app.Options{Logger: log})
//	err = a.Start(ctx)     // listening when it returns
//	resp, err := http.Get("http://" + a.HTTPAddr() + "/stock/BOOK-1")
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

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/service"
	inboxmetrics "github.com/outboxshop/outboxshop/pkg/inbox/metrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	outboxrabbitmq "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// Mode selects what a process runs.
type Mode string

// The modes, one per subcommand of cmd/warehouse.
const (
	// ModeAPI serves the HTTP API on Config.HTTPAddr and consumes the warehouse queue.
	ModeAPI Mode = "api"
	// ModeRelay runs the outbox relay and outbox cleanup, and serves /healthz, /readyz and
	// /metrics on Config.RelayHTTPAddr.
	ModeRelay Mode = "relay"
	// ModeAll runs everything in one process: ModeAPI and the relay (its metrics are on the
	// API's /metrics; RelayHTTPAddr is not used).
	ModeAll Mode = "all"
)

func (m Mode) serves() (api, consumer, relay bool) {
	switch m {
	case ModeAPI:
		return true, true, false
	case ModeRelay:
		return false, false, true
	case ModeAll:
		return true, true, true
	}
	return false, false, false
}

var _ warehousehttp.Store = (*postgres.Store)(nil)

// Options are the parts of an App that do not come from the environment.
type Options struct {
	// Logger receives every log line. nil discards.
	Logger *slog.Logger
	// Failpoints are the armed crash points (failpoint.Parse of Config.Failpoints). nil arms
	// none.
	Failpoints *failpoint.Set
	// Registry collects the metrics served on /metrics. nil makes a new one with the Go and
	// process collectors.
	Registry *prometheus.Registry
}

// App is a running (or ready to run) warehouse process: the components of its mode in one
// internal/service Group.
type App struct {
	cfg  Config
	mode Mode
	log  *slog.Logger
	fp   *failpoint.Set

	// Registry holds its metrics, served on /metrics (docs/metrics.md: those of what the mode
	// runs, with service="warehouse"); register more collectors on it before Start.
	Registry *prometheus.Registry

	group    *service.Group
	pool     *pgxpool.Pool
	store    *postgres.Store
	ln       net.Listener
	consumer *readiness.Link // the consumer's broker connection; nil in ModeRelay
}

// New checks cfg and returns an App that Start runs in mode.
func New(cfg Config, mode Mode, opts Options) (*App, error) {
	if api, consumer, relay := mode.serves(); !api && !consumer && !relay {
		return nil, fmt.Errorf("unknown mode %q: want %s, %s or %s", mode, ModeAPI, ModeRelay, ModeAll)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With(slog.String("mode", string(mode)))
	return &App{
		cfg: cfg, mode: mode, log: log, fp: opts.Failpoints,
		Registry: cmp.Or(opts.Registry, service.NewRegistry()),
		group:    service.NewGroup("warehouse", log),
	}, nil
}

// Start prepares the database (creating and migrating it, and waiting for it until ctx ends
// while it cannot be reached: see [OpenDatabase]), binds the HTTP listener and starts the
// components of the mode in the background. It returns once they are started; the app then
// runs until ctx is cancelled, [App.Stop] is called, or a component fails. After an error,
// Stop releases what Start had acquired.
func (a *App) Start(ctx context.Context) (err error) {
	api, consumer, relay := a.mode.serves()
	if armed := a.fp.Armed(); len(armed) > 0 {
		a.log.WarnContext(ctx, "crash points armed", slog.Any("failpoints", armed))
	}
	defer func() {
		if err != nil {
			_ = a.group.Stop() // releases what was acquired; nothing ran
		}
	}()
	if a.pool, err = OpenDatabase(ctx, a.cfg, a.log); err != nil {
		return err
	}
	a.group.OnStop(a.pool.Close)
	a.store = postgres.NewStore(a.pool)

	// The metrics of every mode: the pool's statistics and the HTTP requests.
	if err := a.Registry.Register(pgxpoolmetrics.New(a.pool, constLabels())); err != nil {
		return fmt.Errorf("register pool metrics: %w", err)
	}
	httpMetrics, err := warehousehttp.NewMetrics(a.Registry, constLabels())
	if err != nil {
		return fmt.Errorf("register HTTP metrics: %w", err)
	}
	var svc *serviceMetrics
	if api || consumer {
		if svc, err = newServiceMetrics(a.Registry); err != nil {
			return fmt.Errorf("register service metrics: %w", err)
		}
	}
	// The consumer and the relay declare the topology on every (re)connect with one
	// declarer, which keeps a queue that exists with other arguments (a changed delivery
	// limit) instead of failing, and warns about it once.
	declarer, err := amqptopo.NewDeclarer(a.cfg.AMQPURL, a.cfg.Topology().Shared(), a.log)
	if err != nil {
		return err
	}
	addr := a.cfg.RelayHTTPAddr
	if api {
		addr = a.cfg.HTTPAddr
	}
	if a.ln, err = service.Listen(ctx, a.group, addr); err != nil {
		return err
	}

	// /readyz: the database, and the broker connections of the consumer and the relay, each
	// of which may be away for BrokerDownGrace (a broker restart) before the process counts
	// as not ready.
	var checks []readiness.Check
	if consumer {
		a.consumer = readiness.NewLink("not connected to the broker yet")
		checks = append(checks, readiness.Check{Name: "consumer", Check: readiness.Connection(a.consumer, a.cfg.BrokerDownGrace)})
		if err := a.addConsumer(declarer, svc); err != nil {
			return err
		}
	}
	if relay {
		check, err := service.AddRelay(a.group, service.RelayConfig{
			Pool: a.pool,
			Publisher: outboxrabbitmq.Config{
				URL: a.cfg.AMQPURL, ConnectionName: "warehouse-relay", Setup: declarer.Setup,
			},
			Settings:        a.cfg.relaySettings(),
			Retention:       a.cfg.OutboxRetention,
			BrokerDownGrace: a.cfg.BrokerDownGrace,
			Registry:        a.Registry,
			ConstLabels:     constLabels(),
			Failpoint:       a.fp.Func(),
			Logger:          a.log,
		})
		if err != nil {
			return err
		}
		checks = append(checks, check)
	}
	httpCfg := warehousehttp.Config{
		Pinger:    a.store,
		Checks:    checks,
		Gatherer:  a.Registry,
		Metrics:   httpMetrics,
		DBTimeout: a.cfg.DBTimeout,
		Logger:    a.log,
	}
	if api {
		httpCfg.Store = a.store
		// The backlog of the outbox table and the stock, read here and not by the relay, so
		// that the backlog stays visible when the relay is down.
		if err := service.AddOutboxStats(a.group, a.Registry, a.pool, constLabels(), a.log); err != nil {
			return err
		}
		a.group.Add("stock metrics", func(ctx context.Context) error {
			return service.Every(ctx, StockMetricsInterval, svc.stockGauge(a.store, a.log))
		})
	}
	service.AddServer(a.group, "http server", a.ln, warehousehttp.NewRouter(httpCfg), a.cfg.ShutdownTimeout, a.log)

	a.group.Start(ctx)
	a.log.InfoContext(ctx, "warehouse started", slog.String("http_addr", a.HTTPAddr()),
		slog.Bool("api", api), slog.Bool("consumer", consumer), slog.Bool("relay", relay))
	return nil
}

func (a *App) addConsumer(declarer *amqptopo.Declarer, svc *serviceMetrics) error {
	consumerMetrics, err := inboxmetrics.NewConsumer(a.Registry, inboxmetrics.Config{KnownTypes: consumedTypes, ConstLabels: constLabels()})
	if err != nil {
		return fmt.Errorf("register consumer metrics: %w", err)
	}
	consumerMetrics.Init(warehouseamqp.ConsumerName)
	consumerMetrics.SetWindow(warehouseamqp.ConsumerName, a.cfg.InboxRetention, redeliveryWindow(a.cfg))
	c, err := warehouseamqp.NewConsumer(a.pool, warehouseamqp.ConsumerConfig{
		URL:             a.cfg.AMQPURL,
		Topology:        a.cfg.Topology(),
		Declarer:        declarer,
		Prefetch:        a.cfg.ConsumerPrefetch,
		Concurrency:     a.cfg.ConsumerConcurrency,
		MaxDeliveries:   a.cfg.ConsumerMaxDeliveries,
		RetryDelay:      a.cfg.ConsumerRetryDelay,
		MaxRetryDelay:   a.cfg.ConsumerMaxRetryDelay,
		MaxHold:         a.cfg.ConsumerMaxHold,
		ShutdownTimeout: a.cfg.ShutdownTimeout,
		Logger:          a.log,
		Hooks: consumerMetrics.Hooks(rabbitmq.Hooks{
			Connected: readiness.ConsumerConnected(a.consumer),
			Failpoint: a.fp.Func(),
		}),
		Committed: svc.committed,
	})
	if err != nil {
		return err
	}
	a.group.Add("consumer", c.Run)
	service.AddInboxCleanup(a.group, a.pool, a.cfg.InboxRetention, 0, a.log)
	return nil
}

// Run starts the app and waits until it stopped: until ctx is cancelled (graceful stop, also
// while Start still waits for the database) or a component failed.
func (a *App) Run(ctx context.Context) error {
	if err := a.Start(ctx); err != nil {
		if ctx.Err() != nil {
			a.log.InfoContext(ctx, "warehouse stopped before it started", slog.Any("error", err))
			return nil
		}
		return err
	}
	return a.Wait()
}

// HTTPAddr is the address the HTTP server listens on ("127.0.0.1:41234"): the API in ModeAPI
// and ModeAll, /healthz, /readyz and /metrics only in ModeRelay.
func (a *App) HTTPAddr() string { return a.ln.Addr().String() }

// Pool is the app's database pool (nil before Start), closed when the app has stopped.
func (a *App) Pool() *pgxpool.Pool { return a.pool }

// Store is the PostgreSQL adapter on Pool (nil before Start).
func (a *App) Store() *postgres.Store { return a.store }

// Consuming reports whether the consumer is connected and consuming (false in ModeRelay).
func (a *App) Consuming() bool {
	if a.consumer == nil {
		return false
	}
	up, _, _ := a.consumer.LinkState()
	return up
}

// Done is closed when the app has stopped: after Stop, the cancellation of Start's ctx, or
// the failure of a component (Stop and Wait then return its error).
func (a *App) Done() <-chan struct{} { return a.group.Done() }

// Wait blocks until every component has stopped and the pool is closed, and returns the
// error of the first component that failed, or nil after a graceful stop.
func (a *App) Wait() error { return a.group.Wait() }

// Stop stops the app gracefully (in-flight requests and messages get
// Config.ShutdownTimeout) and waits for it, like cancelling Start's context.
func (a *App) Stop() error { return a.group.Stop() }

// OpenDatabase creates the database when it does not exist, opens a pool on it and migrates
// it. While the server cannot be reached it retries with backoff and a log line per attempt,
// until ctx ends; it gives up at once only on a configuration error (internal/pgdb).
func OpenDatabase(ctx context.Context, cfg Config, log *slog.Logger) (*pgxpool.Pool, error) {
	return pgdb.Open(ctx, pgdb.Config{
		URL:            cfg.DatabaseURL,
		MaxConns:       cfg.DatabaseMaxConns,
		ConnectTimeout: cfg.DBTimeout,
		Migrate:        postgres.Migrate,
		Logger:         log,
	})
}

// Migrate creates the database when missing and migrates it: the `migrate` subcommand.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	pool, err := OpenDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	pool.Close()
	return nil
}

// Seed resets the catalogue's stock (see [postgres.Store.Seed]): the `seed` subcommand.
func Seed(ctx context.Context, cfg Config, force bool, log *slog.Logger) ([]postgres.SeedChange, error) {
	pool, err := OpenDatabase(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	return postgres.NewStore(pool).Seed(ctx, force)
}

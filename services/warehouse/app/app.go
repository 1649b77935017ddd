// Package app wires the warehouse: configuration, database, broker, HTTP, consumer and relay,
// and the metrics of docs/metrics.md for what each mode runs (service="warehouse"). The
// lifecycle is internal/service's: an [App] is a service.Process; and so is the command line:
// cmd/warehouse runs [Command], which parses the configuration and hands off to [App.Run].
// Tests start an App on 127.0.0.1:0 with [New] and [App.Start], read the address from
// [App.HTTPAddr], and stop it with Stop (or by cancelling the context); see the example.
package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	warehousehttp "github.com/outboxshop/outboxshop/services/warehouse/http"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// Mode selects what a process runs.
type Mode string

// The modes, one per subcommand of cmd/warehouse.
const (
	// ModeAPI serves the HTTP API on Config.HTTPAddr and consumes the warehouse queue;
	// /healthz, /readyz and /metrics are on HTTPAddr too, or on Config.OpsAddr when it is set
	// (HTTPAddr then keeps /healthz and /readyz, not /metrics).
	ModeAPI Mode = "api"
	// ModeRelay runs the outbox relay and outbox cleanup, and serves /healthz, /readyz and
	// /metrics on Config.RelayHTTPAddr.
	ModeRelay Mode = "relay"
	// ModeAll runs everything in one process: ModeAPI and the relay (its metrics are on the
	// API's /metrics, or OpsAddr's when it is set; RelayHTTPAddr is not used).
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

// The store is what the HTTP API and the consumer's handler need of it.
var (
	_ warehousehttp.Store        = (*postgres.Store)(nil)
	_ warehouseamqp.OrderApplier = (*postgres.Store)(nil)
)

// Options are the parts of an App that do not come from the environment (internal/service).
type Options = service.Options

// App is a running (or ready to run) warehouse process: a service.Process (Registry, Stop,
// Wait, Done, Pool) whose Start builds the components of its mode.
type App struct {
	*service.Process
	cfg  Config
	mode Mode

	store *postgres.Store
	http  service.Listeners // the API's and the operations routes' (internal/service)
	// adminToken is the resolved admin token (Config.ResolveAdminToken), "" when disabled.
	adminToken envconfig.Secret
	consumer   *inboxrabbitmq.Consumer // nil in ModeRelay
}

// New checks cfg and returns an App that Start runs in mode.
func New(cfg Config, mode Mode, opts Options) (*App, error) {
	if api, consumer, relay := mode.serves(); !api && !consumer && !relay {
		return nil, fmt.Errorf("unknown mode %q: want %s, %s or %s", mode, ModeAPI, ModeRelay, ModeAll)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Read once: Validate read it too, but a file may change in between.
	adminToken, err := cfg.ResolveAdminToken()
	if err != nil {
		return nil, err
	}
	return &App{Process: service.NewProcess(ServiceName, string(mode), opts), cfg: cfg, mode: mode, adminToken: adminToken}, nil
}

// database is the pgdb configuration of cfg: the warehouse's database, its migrations.
func database(cfg Config) pgdb.Config {
	return pgdb.Config{URL: cfg.DatabaseURL, TLS: cfg.DatabaseTLSFiles(), Setting: "WAREHOUSE_DATABASE_", MaxConns: cfg.DatabaseMaxConns, ConnectTimeout: cfg.DBTimeout, Migrate: postgres.Migrate}
}

// Start prepares the database (creating and migrating it, and waiting for it until ctx ends
// while it cannot be reached: internal/pgdb), binds the HTTP listener and starts the
// components of the mode in the background. It returns once they are started; the app then
// runs until ctx is cancelled, Stop is called, or a component fails. After an error, Stop
// releases what Start had acquired.
func (a *App) Start(ctx context.Context) (err error) {
	defer a.StopOnError(&err)
	api, consumer, relay := a.mode.serves()
	topology := a.cfg.Topology()
	pool, err := a.OpenDatabase(ctx, database(a.cfg))
	if err != nil {
		return err
	}
	if a.store, err = postgres.NewStore(pool, postgres.StoreConfig{Exchange: topology.Exchange, Propagator: a.Propagator}); err != nil {
		return err
	}
	httpMetrics, err := warehousehttp.NewMetrics(a.Registry, a.ConstLabels())
	if err != nil {
		return fmt.Errorf("register HTTP metrics: %w", err)
	}
	var svc *serviceMetrics
	if api || consumer {
		if svc, err = newServiceMetrics(a.Process); err != nil {
			return fmt.Errorf("register service metrics: %w", err)
		}
	}
	// The consumer and the relay declare the topology on every (re)connect with one
	// declarer, which keeps a queue that exists with other arguments (a changed delivery
	// limit) instead of failing, and warns about it once.
	// A broker whose certificate the TLS settings refuse stops the start, naming them.
	brokerTLS, err := service.BrokerTLS(ctx, a.cfg.BrokerEnv, "WAREHOUSE_")
	if err != nil {
		return err
	}
	declarer, err := amqptopo.NewDeclarer(a.cfg.AMQPURLs(), brokerTLS, topology.Shared(), a.Log)
	if err != nil {
		return err
	}
	// The API on WAREHOUSE_HTTP_ADDR and, when set, the operations routes on
	// WAREHOUSE_OPS_ADDR; the relay's operations routes on WAREHOUSE_RELAY_HTTP_ADDR.
	if a.http, err = service.ListenHTTP(ctx, a.Process, api,
		service.HTTPAddrs{API: a.cfg.HTTPAddr, Ops: a.cfg.OpsAddr, Relay: a.cfg.RelayHTTPAddr}); err != nil {
		return err
	}

	// /readyz: the database, the consumer and the relay, each of which may be cut off from
	// the broker for BrokerDownGrace (a broker restart) before the process counts as not
	// ready.
	var checks []readiness.Check
	if consumer {
		var check readiness.Check
		a.consumer, check, err = service.AddConsumer(a.Process, service.ConsumerConfig{
			Consumer: inboxrabbitmq.Config{
				URLs:            a.cfg.AMQPURLs(),
				TLSClientConfig: brokerTLS,
				Queue:           topology.Queue,
				Name:            warehouseamqp.ConsumerName,
				Handler: warehouseamqp.NewHandler(countingApplier{OrderApplier: a.store, committed: svc.committed},
					warehouseamqp.HandlerConfig{OrderCreatedVersions: a.cfg.OrderCreatedVersions, Logger: a.Log}),
				ShutdownTimeout:      a.cfg.ShutdownTimeout,
				DeadLetterExchange:   topology.DeadLetterExchange,
				DeadLetterRoutingKey: topology.Queue,
				Setup:                declarer.Setup,
			},
			Settings:         envconfig.Section[service.ConsumerSettings](a.cfg, "Consumer"),
			KnownTypes:       consumedTypes,
			Retention:        a.cfg.InboxRetention,
			RelayMaxAttempts: a.cfg.RelayMaxAttempts,
			BrokerDownGrace:  a.cfg.BrokerDownGrace,
		})
		if err != nil {
			return err
		}
		checks = append(checks, check)
	}
	if relay {
		check, err := service.AddRelay(a.Process, service.RelayConfig{
			Publisher:       outboxrabbitmq.Config{URLs: a.cfg.AMQPURLs(), TLSClientConfig: brokerTLS, ConnectionName: "warehouse-relay", Setup: declarer.Setup},
			Settings:        envconfig.Section[service.RelaySettings](a.cfg, "Relay"),
			Retention:       a.cfg.OutboxRetention,
			BrokerDownGrace: a.cfg.BrokerDownGrace,
		})
		if err != nil {
			return err
		}
		checks = append(checks, check)
	}
	httpCfg := warehousehttp.Config{
		Pinger: a.store, Checks: checks, Gatherer: a.Registry, Metrics: httpMetrics, DBTimeout: a.cfg.DBTimeout, Logger: a.Log,
		TracerProvider: a.TracerProvider, Propagator: a.Propagator,
	}
	if api {
		apiCfg := httpCfg
		apiCfg.Store, apiCfg.AdminToken, apiCfg.Ops = a.store, a.adminToken, a.http.APIOps()
		if a.adminToken == "" {
			a.Log.InfoContext(ctx, "the admin API is disabled: PUT /stock/{sku} answers 403 until WAREHOUSE_ADMIN_TOKEN or WAREHOUSE_ADMIN_TOKEN_FILE is set")
		}
		// The backlog of the outbox table and the stock, read here and not by the relay, so
		// that the backlog stays visible when the relay is down.
		if err := service.AddOutboxStats(a.Process); err != nil {
			return err
		}
		// Every StockMetricsInterval; after a failed read it backs off from 100ms to 10s
		// (never longer than the interval) and logs the failure once (service.Every).
		service.AddJob(a.Process, service.Job{Name: "stock metrics", Interval: StockMetricsInterval, Run: svc.stockGauge(a.store)})
		service.AddServer(a.Process, "http server", a.http.API, warehousehttp.NewRouter(apiCfg), a.cfg.ShutdownTimeout)
	}
	if a.http.Ops != nil {
		// Without a Store: /healthz, /readyz and /metrics alone.
		service.AddServer(a.Process, "ops http server", a.http.Ops, warehousehttp.NewRouter(httpCfg), a.cfg.ShutdownTimeout)
	}
	a.Launch(ctx, slog.String("http_addr", a.http.APIAddr()), slog.String("ops_addr", a.OpsAddr()),
		slog.Bool("api", api), slog.Bool("consumer", consumer), slog.Bool("relay", relay))
	return nil
}

// Run starts the app and waits until it stopped: until ctx is cancelled (graceful stop, also
// while Start still waits for the database) or a component failed.
func (a *App) Run(ctx context.Context) error { return a.Process.Run(ctx, a.Start) }

// HTTPAddr is the address the HTTP server listens on ("127.0.0.1:41234"): the API in ModeAPI
// and ModeAll, /healthz, /readyz and /metrics only in ModeRelay (OpsAddr too).
func (a *App) HTTPAddr() string {
	if a.http.API == nil {
		return a.http.OpsAddr()
	}
	return a.http.APIAddr()
}

// OpsAddr is where the process serves /healthz, /readyz and /metrics on a listener of their
// own: the relay's (WAREHOUSE_RELAY_HTTP_ADDR), or the api and all processes' when
// WAREHOUSE_OPS_ADDR is set; "" when the API serves them.
func (a *App) OpsAddr() string { return a.http.OpsAddr() }

// Store is the PostgreSQL adapter on Pool (nil before Start).
func (a *App) Store() *postgres.Store { return a.store }

// Consuming reports whether the consumer consumes on a live broker connection (false in
// ModeRelay, and before Start).
func (a *App) Consuming() bool { return a.consumer != nil && a.consumer.Connected() }

// Migrate creates the database when missing and migrates it: the `migrate` subcommand.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	return pgdb.Migrate(ctx, database(cfg), log)
}

// Seed resets the catalogue's stock (see [postgres.Store.Seed]): the `seed` subcommand. It
// creates and migrates the database first, like Migrate.
func Seed(ctx context.Context, cfg Config, force bool, log *slog.Logger) ([]postgres.SeedChange, error) {
	db := database(cfg)
	db.Logger = log
	pool, err := pgdb.Open(ctx, db)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: cfg.Topology().Exchange})
	if err != nil {
		return nil, err
	}
	return store.Seed(ctx, force)
}

// Package app wires the warehouse: configuration, database, broker, HTTP, consumer and relay,
// and the metrics of docs/metrics.md for what each mode runs (service="warehouse").
// cmd/warehouse parses the configuration and hands off to [Run]; tests call [Start] with
// listeners on 127.0.0.1:0, read the address from [App.HTTPAddr], and stop the app with
// [App.Stop] (or by cancelling the context).
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/httpserver"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	inboxmetrics "github.com/outboxshop/outboxshop/pkg/inbox/metrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	inboxrabbitmqmetrics "github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq/rabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	outboxmetrics "github.com/outboxshop/outboxshop/pkg/outbox/metrics"
	outboxrabbitmq "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq"
	outboxrabbitmqmetrics "github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq/rabbitmqmetrics"
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

var _ warehousehttp.Store = (*postgres.Repo)(nil)

// App is a running warehouse process. Create it with [Start].
type App struct {
	// Config is the configuration it runs with.
	Config Config
	// Mode is what it runs.
	Mode Mode
	// Logger is its logger.
	Logger *slog.Logger
	// Registry holds its metrics, served on /metrics (docs/metrics.md: those of what the mode
	// runs, with service="warehouse"); register more collectors on it.
	Registry *prometheus.Registry
	// Pool is its database pool, closed when the app has stopped.
	Pool *pgxpool.Pool
	// Repo is the repository on Pool.
	Repo *postgres.Repo

	ln       net.Listener
	cancel   context.CancelFunc
	done     chan struct{}
	err      error
	consumer *readiness.Link // the consumer's broker connection; nil in ModeRelay
	relay    *outbox.Relay
}

// Start prepares the database (creating and migrating it, and waiting for it until ctx ends
// while it cannot be reached: see [OpenDatabase]), binds the HTTP listener and starts the
// components of mode in the background. It returns once they are started; the app then runs
// until ctx is cancelled, [App.Stop] is called, or a component fails. log nil discards.
func Start(ctx context.Context, cfg Config, mode Mode, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	api, consumer, relay := mode.serves()
	if !api && !consumer && !relay {
		return nil, fmt.Errorf("unknown mode %q: want %s, %s or %s", mode, ModeAPI, ModeRelay, ModeAll)
	}
	log = orDiscard(log).With(slog.String("mode", string(mode)))
	fp, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", failpoint.EnvVar, err)
	}
	if armed := fp.Armed(); len(armed) > 0 {
		log.WarnContext(ctx, "crash points armed", slog.Any("failpoints", armed))
	}

	pool, err := OpenDatabase(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	a := &App{
		Config:   cfg,
		Mode:     mode,
		Logger:   log,
		Registry: prometheus.NewRegistry(),
		Pool:     pool,
		Repo:     postgres.NewRepo(pool),
		done:     make(chan struct{}),
	}
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var components []component
	var cleanup []func()
	fail := func(err error) (*App, error) {
		for _, f := range cleanup {
			f()
		}
		pool.Close()
		return nil, err
	}

	// The metrics of every mode: the pool's statistics and the HTTP requests.
	if err := a.Registry.Register(pgxpoolmetrics.New(pool, constLabels())); err != nil {
		return fail(fmt.Errorf("register pool metrics: %w", err))
	}
	httpMetrics, err := warehousehttp.NewMetrics(a.Registry, constLabels())
	if err != nil {
		return fail(fmt.Errorf("register HTTP metrics: %w", err))
	}
	var svc *serviceMetrics
	if api || consumer {
		if svc, err = newServiceMetrics(a.Registry); err != nil {
			return fail(fmt.Errorf("register service metrics: %w", err))
		}
	}

	// The consumer and the relay declare the topology on every (re)connect with one
	// declarer, which keeps a queue that exists with other arguments (a changed delivery
	// limit) instead of failing, and warns about it once.
	declarer, err := amqptopo.NewDeclarer(cfg.AMQPURL, cfg.Topology().Shared(), log)
	if err != nil {
		return fail(err)
	}
	// /readyz: the database, and the broker connections of the consumer and the relay, each
	// of which may be away for BrokerDownGrace (a broker restart) before the process counts
	// as not ready. An idle relay does not try the broker: it notices an outage with the
	// next message it has to publish.
	var checks []readiness.Check
	relayLink := readiness.NewLink("starting")
	if consumer {
		a.consumer = readiness.NewLink("not connected to the broker yet")
		checks = append(checks, readiness.Check{Name: "consumer", Check: readiness.Connection(a.consumer, cfg.BrokerDownGrace)})
	}
	if relay {
		checks = append(checks, readiness.Check{Name: "relay", Check: readiness.Connection(relayLink, cfg.BrokerDownGrace)})
	}
	httpCfg := warehousehttp.Config{
		Pinger:    a.Repo,
		Checks:    checks,
		Gatherer:  a.Registry,
		Metrics:   httpMetrics,
		DBTimeout: cfg.DBTimeout,
		Logger:    log,
	}
	addr := cfg.RelayHTTPAddr
	if api {
		httpCfg.Store = a.Repo
		addr = cfg.HTTPAddr
	}
	a.ln, err = net.Listen("tcp", addr)
	if err != nil {
		return fail(fmt.Errorf("listen on %s: %w", addr, err))
	}
	cleanup = append(cleanup, func() { _ = a.ln.Close() })
	handler := warehousehttp.NewRouter(httpCfg)
	components = append(components, component{"http", func(ctx context.Context) error {
		return httpserver.Serve(ctx, a.ln, handler, httpserver.Config{ShutdownTimeout: cfg.ShutdownTimeout}, log)
	}})

	if api {
		// The backlog of the outbox table and the stock, read here and not by the relay, so
		// that the backlog stays visible when the relay is down.
		stats, err := outboxmetrics.NewStats(a.Registry, pool, outboxmetrics.StatsConfig{ConstLabels: constLabels(), Logger: log})
		if err != nil {
			return fail(fmt.Errorf("register outbox stats metrics: %w", err))
		}
		components = append(components,
			component{"outbox stats", stats.Run},
			component{"stock metrics", func(ctx context.Context) error {
				return svc.runStockGauge(ctx, a.Repo, StockMetricsInterval, log)
			}})
	}

	if consumer {
		consumerMetrics, err := inboxrabbitmqmetrics.NewConsumer(a.Registry, inboxrabbitmqmetrics.Config{KnownTypes: consumedTypes, ConstLabels: constLabels()})
		if err != nil {
			return fail(fmt.Errorf("register consumer metrics: %w", err))
		}
		consumerMetrics.Init(warehouseamqp.ConsumerName)
		window, err := inboxmetrics.NewWindow(a.Registry, constLabels())
		if err != nil {
			return fail(fmt.Errorf("register inbox window metrics: %w", err))
		}
		window.Set(warehouseamqp.ConsumerName, cfg.InboxRetention, redeliveryWindow(cfg))
		c, err := warehouseamqp.NewConsumer(pool, warehouseamqp.ConsumerConfig{
			URL:             cfg.AMQPURL,
			Topology:        cfg.Topology(),
			Declarer:        declarer,
			Prefetch:        cfg.ConsumerPrefetch,
			Concurrency:     cfg.ConsumerConcurrency,
			MaxDeliveries:   cfg.ConsumerMaxDeliveries,
			RetryDelay:      cfg.ConsumerRetryDelay,
			MaxRetryDelay:   cfg.ConsumerMaxRetryDelay,
			MaxHold:         cfg.ConsumerMaxHold,
			ShutdownTimeout: cfg.ShutdownTimeout,
			Logger:          log,
			Hooks: consumerMetrics.Hooks(rabbitmq.Hooks{
				Connected: readiness.ConsumerConnected(a.consumer),
				Failpoint: failpoint.Hook(fp, func(h rabbitmq.FailpointHit) string { return h.Name }),
			}),
			Committed: svc.committed,
		})
		if err != nil {
			return fail(err)
		}
		consumerMetrics.SetPoolSize(warehouseamqp.ConsumerName, c.PoolSize())
		components = append(components,
			component{"consumer", c.Run},
			component{"inbox cleanup", func(ctx context.Context) error {
				return inbox.RunCleanup(ctx, pool, inbox.CleanupConfig{Retention: cfg.InboxRetention, Logger: log})
			}})
	}

	if relay {
		relayMetrics, err := outboxmetrics.NewRelay(a.Registry, constLabels())
		if err != nil {
			return fail(fmt.Errorf("register relay metrics: %w", err))
		}
		publisherMetrics, err := outboxrabbitmqmetrics.NewPublisher(a.Registry, constLabels())
		if err != nil {
			return fail(fmt.Errorf("register publisher metrics: %w", err))
		}
		pub, err := warehouseamqp.NewPublisher(cfg.AMQPURL, declarer, log, publisherMetrics.Hooks(outboxrabbitmq.Hooks{}))
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, func() { _ = pub.Close() })
		a.relay, err = outbox.NewRelay(pool, pub, outbox.Config{
			BatchSize:       cfg.RelayBatchSize,
			PollInterval:    cfg.RelayPollInterval,
			MaxAttempts:     cfg.RelayMaxAttempts,
			PublishTimeout:  cfg.RelayPublishTimeout,
			ClaimTimeout:    cfg.RelayClaimTimeout,
			MaxMessageBytes: cfg.RelayMaxMessageBytes,
			RetryBaseDelay:  relayRetryBaseDelay,
			RetryMaxDelay:   relayRetryMaxDelay,
			Logger:          log,
			Hooks:           relayMetrics.Hooks(outbox.Hooks{Failpoint: failpoint.Hook(fp, func(h outbox.FailpointHit) string { return h.Name }), StateChanged: readiness.RelayState(relayLink)}),
		})
		if err != nil {
			return fail(fmt.Errorf("new relay: %w", err))
		}
		relayMetrics.SetPoolSize(a.relay.PoolSize())
		components = append(components,
			component{"relay", a.relay.Run},
			component{"outbox cleanup", func(ctx context.Context) error {
				return outbox.RunCleanup(ctx, pool, outbox.CleanupConfig{Retention: cfg.OutboxRetention, Logger: log})
			}})
	}

	runCtx, cancel := context.WithCancel(ctx)
	a.cancel = cancel
	a.run(runCtx, components, cleanup)
	log.InfoContext(ctx, "warehouse started", slog.String("http_addr", a.HTTPAddr()),
		slog.Bool("api", api), slog.Bool("consumer", consumer), slog.Bool("relay", relay))
	return a, nil
}

// Run starts the app and waits until it stopped: until ctx is cancelled (graceful stop, also
// while Start still waits for the database) or a component failed.
func Run(ctx context.Context, cfg Config, mode Mode, log *slog.Logger) error {
	a, err := Start(ctx, cfg, mode, log)
	if err != nil {
		if ctx.Err() != nil {
			orDiscard(log).InfoContext(ctx, "warehouse stopped before it started", slog.Any("error", err))
			return nil
		}
		return err
	}
	return a.Wait()
}

// HTTPAddr is the address the HTTP server listens on ("127.0.0.1:41234"): the API in ModeAPI
// and ModeAll, /healthz, /readyz and /metrics only in ModeRelay.
func (a *App) HTTPAddr() string { return a.ln.Addr().String() }

// Consuming reports whether the consumer is connected and consuming (false in ModeRelay).
func (a *App) Consuming() bool {
	if a.consumer == nil {
		return false
	}
	up, _, _ := a.consumer.LinkState()
	return up
}

// Wait blocks until every component has stopped and the pool is closed, and returns the
// error of the first component that failed, or nil after a graceful stop.
func (a *App) Wait() error {
	<-a.done
	return a.err
}

// Stop stops the app gracefully (in-flight requests and messages get
// Config.ShutdownTimeout) and waits for it, like cancelling Start's context.
func (a *App) Stop() error {
	a.cancel()
	return a.Wait()
}

type component struct {
	name string
	run  func(ctx context.Context) error
}

// run starts the components; the first to fail stops the others. When all have returned,
// cleanup runs, the pool is closed and done is closed.
func (a *App) run(ctx context.Context, components []component, cleanup []func()) {
	var (
		wg   sync.WaitGroup
		once sync.Once
	)
	for _, c := range components {
		wg.Go(func() {
			err := c.run(ctx)
			if err == nil && ctx.Err() == nil {
				err = errors.New("stopped by itself")
			}
			if err != nil {
				once.Do(func() {
					a.err = fmt.Errorf("%s: %w", c.name, err)
					a.Logger.ErrorContext(ctx, "component failed; stopping", slog.String("component", c.name), slog.Any("error", err))
				})
				a.cancel()
			}
		})
	}
	go func() {
		wg.Wait()
		for _, f := range cleanup {
			f()
		}
		a.Pool.Close()
		a.Logger.Info("warehouse stopped")
		close(a.done)
	}()
}

// OpenDatabase creates the database when it does not exist, opens a pool on it and migrates
// it. While the server cannot be reached it retries with backoff and a log line per attempt,
// until ctx ends; it gives up at once only on a configuration error (internal/pgdb).
func OpenDatabase(ctx context.Context, cfg Config, log *slog.Logger) (*pgxpool.Pool, error) {
	return pgdb.Open(ctx, pgdb.Config{
		URL:            cfg.DatabaseURL,
		MaxConns:       cfg.DatabaseMaxConns,
		ConnectTimeout: cfg.DBTimeout,
		Migrate:        postgres.Migrate,
		Logger:         orDiscard(log),
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

// Seed resets the catalogue's stock (see [postgres.Repo.Seed]): the `seed` subcommand.
func Seed(ctx context.Context, cfg Config, force bool, log *slog.Logger) ([]postgres.SeedChange, error) {
	pool, err := OpenDatabase(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	return postgres.NewRepo(pool).Seed(ctx, force)
}

func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return log
}

package service

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgtrace"
	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/telemetry"
)

// Options are the parts of a process that do not come from the environment; both services'
// app.Options are this type.
type Options struct {
	// Logger receives every log line. nil discards.
	Logger *slog.Logger
	// Failpoints are the armed crash points (failpoint.Parse of CHAOS_FAILPOINTS). nil arms
	// none.
	Failpoints *failpoint.Set
	// Registry collects the metrics served on /metrics. nil makes a new one with the Go and
	// process collectors (NewRegistry). Start registers the service's metrics on it
	// (docs/metrics.md), so one registry serves one process.
	Registry *prometheus.Registry
	// TracerProvider makes the process's spans: the HTTP server's, the database queries',
	// the relay's publish and the consumer's process spans (docs/tracing.md); cmd/ passes
	// internal/telemetry's, a test an SDK provider of its own. nil: a no-op provider, which
	// records nothing but carries a trace context it is given on to the events.
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in HTTP and message headers. nil: W3C
	// TraceContext and Baggage (telemetry.Propagator).
	Propagator propagation.TextMapPropagator
}

// Process is what an App of either service is besides its wiring: its log, crash points and
// metrics registry, its database pool, and the Group of its components, with the lifecycle
// methods an App exposes (Stop, Wait, Done, Pool). Both services' App types embed it and
// add Start, which builds the components of their mode.
type Process struct {
	// Registry is what /metrics serves. Add collectors to it before Start.
	Registry *prometheus.Registry
	// Log is the process's logger, with its mode.
	Log *slog.Logger
	// Failpoints are the armed crash points (nil arms none; its methods accept nil).
	Failpoints *failpoint.Set
	// Group runs the components.
	Group *Group
	// TracerProvider and Propagator are those of the Options, with their defaults: hand
	// them to every component that makes spans or carries a trace context.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator

	name        string
	constLabels prometheus.Labels
	pool        *pgxpool.Pool
}

// NewProcess returns the process of service (its name, also the service label of its
// metrics) in mode.
func NewProcess(service, mode string, opts Options) *Process {
	log := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With(slog.String("mode", mode))
	reg := opts.Registry
	if reg == nil {
		reg = NewRegistry()
	}
	tp, prop := opts.TracerProvider, opts.Propagator
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if prop == nil {
		prop = telemetry.Propagator()
	}
	return &Process{
		Registry: reg, Log: log, Failpoints: opts.Failpoints, Group: NewGroup(service, log),
		TracerProvider: tp, Propagator: prop,
		name: service, constLabels: ConstLabels(service),
	}
}

// ConstLabels are the labels of every metric of the process (ConstLabels of its service).
func (p *Process) ConstLabels() prometheus.Labels { return p.constLabels }

// OpenDatabase opens the service's database with internal/pgdb (creating it when it does
// not exist, migrating it, and waiting until ctx ends while the server cannot be reached),
// closes it when the process stops, and registers the pool's metrics. It logs the armed
// crash points first: it is the first step of every Start.
func (p *Process) OpenDatabase(ctx context.Context, cfg pgdb.Config) (*pgxpool.Pool, error) {
	if armed := p.Failpoints.Armed(); len(armed) > 0 {
		p.Log.WarnContext(ctx, "crash points armed", slog.Any("failpoints", armed))
	}
	cfg.Logger, cfg.Tracer = p.Log, pgtrace.New(p.TracerProvider)
	pool, err := pgdb.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	p.pool = pool
	p.Group.OnStop(pool.Close)
	if err := p.Registry.Register(pgxpoolmetrics.New(pool, p.constLabels)); err != nil {
		return nil, fmt.Errorf("register pool metrics: %w", err)
	}
	return pool, nil
}

// Pool is the process's database pool (nil before Start), closed when the process has
// stopped.
func (p *Process) Pool() *pgxpool.Pool { return p.pool }

// StopOnError releases what a failed Start acquired: defer it with Start's named error.
func (p *Process) StopOnError(err *error) {
	if *err != nil {
		_ = p.Group.Stop()
	}
}

// Launch starts the Group (see [Group.Start]) and logs that the process started, with attrs.
func (p *Process) Launch(ctx context.Context, attrs ...any) {
	p.Group.Start(ctx)
	p.Log.InfoContext(ctx, p.name+" started", attrs...)
}

// Run calls start, then waits until the process stopped: until ctx is cancelled (a graceful
// stop, also while start still waits for the database) or a component failed, whose error
// it returns.
func (p *Process) Run(ctx context.Context, start func(context.Context) error) error {
	if err := start(ctx); err != nil {
		if ctx.Err() != nil {
			p.Log.InfoContext(ctx, p.name+" stopped before it started", slog.Any("error", err))
			return nil
		}
		return err
	}
	return p.Wait()
}

// Done is closed when the process has stopped: after Stop, the cancellation of Start's ctx,
// or the failure of a component (Stop and Wait then return its error).
func (p *Process) Done() <-chan struct{} { return p.Group.Done() }

// Wait blocks until every component has stopped and the pool is closed, and returns the
// first error a component failed with, or nil after a graceful stop.
func (p *Process) Wait() error { return p.Group.Wait() }

// Stop stops every component gracefully (in-flight requests finish, the consumer
// acknowledges what it handled, the relay finishes its batch, each within its shutdown
// timeout), closes the pool, and returns the first error a component failed with. It may be
// called more than once.
func (p *Process) Stop() error { return p.Group.Stop() }

// Command orders runs the orders service of outboxshop.
//
//	orders api      the HTTP API and the consumer of the stock events (also: orders serve)
//	orders relay    the outbox relay and its cleanup, with /healthz and /metrics on ORDERS_RELAY_HTTP_ADDR
//	orders all      everything in one process
//	orders migrate  create the database if needed, apply the migrations, exit
//
// The configuration comes from environment variables prefixed ORDERS_ (ORDERS_DATABASE_URL,
// ORDERS_AMQP_URL, ORDERS_HTTP_ADDR, …), so that it can run from the same shell as the
// warehouse (WAREHOUSE_…); CHAOS_FAILPOINTS, shared by both, arms crash points for chaos
// tests; the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, …) turn on the export
// of traces (internal/telemetry, docs/tracing.md). See the README or app.Config. SIGINT and
// SIGTERM stop it gracefully.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/logging"
	"github.com/outboxshop/outboxshop/internal/telemetry"
	"github.com/outboxshop/outboxshop/services/orders/app"
)

const usage = `usage: orders <command>

commands:
  api, serve   run the HTTP API and the stock-event consumer
  relay        run the outbox relay (and its cleanup), with /healthz and /metrics
  all          run everything in one process
  migrate      create the database if needed and apply the migrations

configuration: ORDERS_* environment variables (and CHAOS_FAILPOINTS), see services/orders/README.md
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("want exactly one command, got %d arguments", len(args))
	}
	var mode app.Mode
	switch args[0] {
	case "api", "serve":
		mode = app.ModeAPI
	case "relay":
		mode = app.ModeRelay
	case "all":
		mode = app.ModeAll
	case "migrate":
	case "help", "-h", "-help", "--help":
		fmt.Print(usage)
		return nil
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}

	cfg, err := app.LoadConfig()
	if err != nil {
		return err
	}
	log, err := logging.New(os.Stdout, cfg.LogFormat, cfg.LogLevel, "orders")
	if err != nil {
		return err
	}
	fp, err := failpoint.FromEnv()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if mode == "" {
		return app.Migrate(ctx, cfg, log)
	}
	tel, err := telemetry.FromEnv(ctx, nil, app.ServiceName)
	if err != nil {
		return err
	}
	// After the App stopped: the spans of its last requests and messages are sent within
	// the shutdown timeout.
	defer tel.Close(cfg.HTTPShutdownTimeout, log)
	a, err := app.New(cfg, mode, app.Options{
		Logger: log.With("process", string(mode)), Failpoints: fp,
		TracerProvider: tel.TracerProvider(), Propagator: tel.Propagator(),
	})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

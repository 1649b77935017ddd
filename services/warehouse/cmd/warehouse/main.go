// Command warehouse runs the warehouse service of outboxshop.
//
//	warehouse api|serve   HTTP API and the consumer of the orders' events
//	warehouse relay       the outbox relay (and outbox cleanup), with /healthz and /metrics
//	warehouse all         everything in one process
//	warehouse migrate     create and migrate the database, then exit
//	warehouse seed        reset the catalogue's stock (refuses while stock is reserved,
//	                      unless --force)
//
// Configuration comes from environment variables (see the README); the standard OTEL_*
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, …) turn on the export of traces
// (internal/telemetry, docs/tracing.md). SIGINT and SIGTERM stop the process gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/logging"
	"github.com/outboxshop/outboxshop/internal/telemetry"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

const usage = `usage: warehouse <command>

commands:
  api, serve      serve the HTTP API and consume the orders' events
  relay           publish the outbox (serves /healthz, /readyz, /metrics on WAREHOUSE_RELAY_HTTP_ADDR)
  all             api and relay in one process
  migrate         create and migrate the database, then exit
  seed [--force]  reset the catalogue's stock; --force also while reservations hold stock

Configuration is read from WAREHOUSE_* environment variables; see README.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env.ToMap(os.Environ()), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command with the configuration in environ and returns the exit code:
// 0 success, 1 failure, 2 bad usage.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	if cmd == "help" || cmd == "-h" || cmd == "--help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	cfg, err := app.LoadConfigFrom(environ)
	if err != nil {
		fmt.Fprintln(stderr, "warehouse:", err)
		return 1
	}
	log, err := logging.New(stdout, cfg.LogFormat, cfg.LogLevel, "warehouse")
	if err != nil {
		fmt.Fprintln(stderr, "warehouse:", err)
		return 1
	}

	switch cmd {
	case "api", "serve":
		err = serve(ctx, cfg, app.ModeAPI, environ, log)
	case "relay":
		err = serve(ctx, cfg, app.ModeRelay, environ, log)
	case "all":
		err = serve(ctx, cfg, app.ModeAll, environ, log)
	case "migrate":
		err = app.Migrate(ctx, cfg, log)
	case "seed":
		fs := flag.NewFlagSet("seed", flag.ContinueOnError)
		fs.SetOutput(stderr)
		force := fs.Bool("force", false, "seed even while reservations hold stock")
		if err := fs.Parse(args); err != nil {
			return 2
		}
		changes, serr := app.Seed(ctx, cfg, *force, log)
		if serr == nil {
			for _, c := range changes {
				fmt.Fprintf(stdout, "%s: %d -> %d\n", c.SKU, c.From, c.To)
			}
			fmt.Fprintf(stdout, "seeded %d SKUs (%d changed)\n", len(warehouse.Catalogue), len(changes))
		}
		if warehouse.ErrorCode(serr) == warehouse.CodeConflict {
			fmt.Fprintln(stderr, "warehouse seed:", warehouse.ErrorMessage(serr))
			return 1
		}
		err = serr
	default:
		fmt.Fprintf(stderr, "warehouse: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.ErrorContext(ctx, "warehouse failed", "command", cmd, "error", err)
		return 1
	}
	return 0
}

// serve runs the app in mode until ctx is cancelled or a component fails.
func serve(ctx context.Context, cfg app.Config, mode app.Mode, environ map[string]string, log *slog.Logger) error {
	fp, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return fmt.Errorf("%s: %w", failpoint.EnvVar, err)
	}
	tel, err := telemetry.FromEnv(ctx, environ, app.ServiceName)
	if err != nil {
		return err
	}
	// After the App stopped: the spans of its last requests and messages are sent within
	// the shutdown timeout.
	defer tel.Close(cfg.ShutdownTimeout, log)
	a, err := app.New(cfg, mode, app.Options{
		Logger: log, Failpoints: fp, TracerProvider: tel.TracerProvider(), Propagator: tel.Propagator(),
	})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

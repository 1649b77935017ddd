package app

import (
	"context"
	"flag"
	"fmt"

	"github.com/outboxshop/outboxshop/internal/deadletters"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

const usage = `usage: warehouse <command>

commands:
  api, serve      serve the HTTP API and consume the orders' events (/metrics on
                  WAREHOUSE_OPS_ADDR instead of the API's address when it is set)
  relay           publish the outbox (serves /healthz, /readyz, /metrics on WAREHOUSE_RELAY_HTTP_ADDR)
  all             api and relay in one process
  migrate         create and migrate the database, then exit
  seed [--force]  reset the catalogue's stock; --force also while reservations hold stock
  dead-letters [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]
                  replay dead letters of WAREHOUSE_DEAD_LETTER_QUEUE (or Q) into the queue each
                  came from, those of type T, version N, a reason containing TEXT (all: AND);
                  --dry-run counts and moves nothing; --json prints one JSON object

Configuration is read from WAREHOUSE_* environment variables (and CHAOS_FAILPOINTS); see
services/warehouse/README.md.
`

// Command is the warehouse binary's command line (internal/service Command, the same in both
// services): api (also serve), relay and all run an [App] in that [Mode]; migrate is
// [Migrate]; seed is [Seed]; dead-letters replays dead letters (internal/deadletters, the same
// in both services). cmd/warehouse runs it.
func Command() service.Command[Config] {
	return service.Command[Config]{
		Name: ServiceName, Usage: usage, Load: LoadConfigFrom, Migrate: Migrate,
		Settings: func(c Config) service.Settings {
			return service.Settings{LogFormat: c.LogFormat, LogLevel: c.LogLevel, ShutdownTimeout: c.ShutdownTimeout}
		},
		New: func(c Config, mode string, opts Options) (service.Runner, error) { return New(c, Mode(mode), opts) },
		Commands: map[string]service.Subcommand[Config]{
			"seed": seed,
			deadletters.Name: deadletters.Subcommand(ServiceName, func(c Config) (service.BrokerEnv, string) {
				return c.BrokerEnv, c.DeadLetterQueue
			}),
		},
	}
}

// seed is the seed subcommand: it prints what it changed, and a refusal (stock is
// reserved, without --force) on stderr.
func seed(ctx context.Context, cfg Config, args []string, out service.Output) int {
	fs := flag.NewFlagSet("seed", flag.ContinueOnError)
	fs.SetOutput(out.Stderr)
	force := fs.Bool("force", false, "seed even while reservations hold stock")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	changes, err := Seed(ctx, cfg, *force, out.Log)
	if warehouse.ErrorCode(err) == warehouse.CodeConflict {
		fmt.Fprintln(out.Stderr, "warehouse seed:", warehouse.ErrorMessage(err))
		return 1
	}
	if err != nil {
		return out.Exit(ctx, err)
	}
	for _, c := range changes {
		fmt.Fprintf(out.Stdout, "%s: %d -> %d\n", c.SKU, c.From, c.To)
	}
	fmt.Fprintf(out.Stdout, "seeded %d SKUs (%d changed)\n", len(warehouse.Catalogue), len(changes))
	return 0
}

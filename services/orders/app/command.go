package app

import (
	"github.com/outboxshop/outboxshop/internal/deadletters"
	"github.com/outboxshop/outboxshop/internal/service"
)

const usage = `usage: orders <command>

commands:
  api, serve      serve the HTTP API and consume the warehouse's stock events (/metrics on
                  ORDERS_OPS_ADDR instead of the API's address when it is set)
  relay           publish the outbox (serves /healthz, /readyz, /metrics on ORDERS_RELAY_HTTP_ADDR)
  all             api and relay in one process
  migrate         create and migrate the database, then exit
  dead-letters [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]
                  replay dead letters of ORDERS_DEAD_LETTER_QUEUE (or Q) into the queue each
                  came from, those of type T, version N, a reason containing TEXT (all: AND);
                  --dry-run counts and moves nothing; --json prints one JSON object

Configuration is read from ORDERS_* environment variables (and CHAOS_FAILPOINTS); see
services/orders/README.md.
`

// Command is the orders binary's command line (internal/service Command, the same in both
// services): api (also serve), relay and all run an [App] in that [Mode]; migrate is
// [Migrate]; dead-letters replays dead letters (internal/deadletters, the same in both
// services). cmd/orders runs it.
func Command() service.Command[Config] {
	return service.Command[Config]{
		Name: ServiceName, Usage: usage, Load: LoadConfigFrom, Migrate: Migrate,
		Settings: func(c Config) service.Settings {
			return service.Settings{LogFormat: c.LogFormat, LogLevel: c.LogLevel, ShutdownTimeout: c.HTTPShutdownTimeout}
		},
		New: func(c Config, mode string, opts Options) (service.Runner, error) { return New(c, Mode(mode), opts) },
		Commands: map[string]service.Subcommand[Config]{
			deadletters.Name: deadletters.Subcommand(ServiceName, func(c Config) (service.BrokerEnv, string) {
				return c.BrokerEnv, c.DeadLetterQueue
			}),
		},
	}
}

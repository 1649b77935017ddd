package app

import "github.com/outboxshop/outboxshop/internal/service"

const usage = `usage: orders <command>

commands:
  api, serve   run the HTTP API and the stock-event consumer
  relay        run the outbox relay (and its cleanup), with /healthz and /metrics
  all          run everything in one process
  migrate      create the database if needed and apply the migrations

configuration: ORDERS_* environment variables (and CHAOS_FAILPOINTS), see services/orders/README.md
`

// Command is the orders binary's command line (internal/service Command, the same in both
// services): api (also serve), relay and all run an [App] in that [Mode]; migrate is
// [Migrate]. cmd/orders runs it.
func Command() service.Command[Config] {
	return service.Command[Config]{
		Name: ServiceName, Usage: usage, Load: LoadConfigFrom, Migrate: Migrate,
		Settings: func(c Config) service.Settings {
			return service.Settings{LogFormat: c.LogFormat, LogLevel: c.LogLevel, ShutdownTimeout: c.HTTPShutdownTimeout}
		},
		New: func(c Config, mode string, opts Options) (service.Runner, error) { return New(c, Mode(mode), opts) },
	}
}

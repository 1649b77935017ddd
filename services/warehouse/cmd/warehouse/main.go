// Command warehouse runs the warehouse service of outboxshop.
//
//	warehouse api|serve  the HTTP API and the consumer of the orders' events
//	warehouse relay      the outbox relay (and outbox cleanup), with /healthz, /readyz and /metrics
//	warehouse all        everything in one process
//	warehouse migrate    create and migrate the database, then exit
//	warehouse seed       reset the catalogue's stock (refuses while stock is reserved, unless --force)
//	warehouse dead-letters [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]
//	                     replay dead letters into the queue each came from (internal/deadletters)
//
// Configuration comes from environment variables prefixed WAREHOUSE_ (see the README or
// app.Config), so that it runs from the same shell as the orders service (ORDERS_…);
// CHAOS_FAILPOINTS, shared by both, arms crash points for chaos tests; the standard OTEL_*
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, …) turn on the export of traces
// (internal/telemetry, docs/tracing.md). SIGINT and SIGTERM stop the process gracefully. The
// command line is internal/service Command's, the same in both services: app.Command.
package main

import (
	"os"

	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

func main() { os.Exit(app.Command().Main()) }

// Command orders runs the orders service of outboxshop.
//
//	orders api|serve  the HTTP API and the consumer of the stock events
//	orders relay      the outbox relay (and outbox cleanup), with /healthz, /readyz and /metrics
//	orders all        everything in one process
//	orders migrate    create and migrate the database, then exit
//	orders dead-letters [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]
//	                  replay dead letters into the queue each came from (internal/deadletters)
//
// Configuration comes from environment variables prefixed ORDERS_ (see the README or
// app.Config), so that it runs from the same shell as the warehouse (WAREHOUSE_…);
// CHAOS_FAILPOINTS, shared by both, arms crash points for chaos tests; the standard OTEL_*
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, …) turn on the export of traces
// (internal/telemetry, docs/tracing.md). SIGINT and SIGTERM stop the process gracefully. The
// command line is internal/service Command's, the same in both services: app.Command.
package main

import (
	"os"

	"github.com/outboxshop/outboxshop/services/orders/app"
)

func main() { os.Exit(app.Command().Main()) }

// Package internal is the service kit: what the orders service and the warehouse both need,
// written once, so that the twins behave, and read, as one author wrote both. Each service's
// app package is wiring only; README.md in this folder has the table of the shared
// conventions, where each lives and why it was chosen over the other service's former idiom.
//
//   - lifecycle: a process is a service.Process (New, then Start on :0 in tests, Stop or
//     Run), its long-running parts components of a service.Group; the periodic jobs run on
//     service.Every (service.AddJob); the wiring both services repeat (the relay and its cleanup, the inbox
//     cleanup, the outbox stats, consumer hooks and settings, HTTP servers and listeners) is
//     service's too;
//   - outages: every background loop backs off while the database or the broker is away
//     and logs the outage once, through retry.Backoff and retry.Streak (generated into each
//     library too);
//   - configuration: a Config with the variable and its default in each field's tags, read
//     and checked with envconfig (Load, Defaults, Checks, Section, Variables); the settings
//     both services have (service.RelayEnv, ConsumerEnv, BrokerEnv) declared once, with
//     their checks, and embedded under the service's prefix;
//   - a service's own metrics declared with service.Metrics; the events' schema version
//     and header (events);
//   - errors: one error type with typed codes (apperr), mapped to HTTP statuses in one
//     problem.Table per service, answered as RFC 9457 problem documents (problem);
//   - the HTTP edge: httpapi.Edge (request id, access log, metrics, recoverer, 404/405,
//     problem answers, /healthz /readyz /metrics), the input policy (input, httpapi:
//     ReadJSON, DecodeJSON, Token), readiness checks (readiness), HTTP metrics by route
//     pattern (httpmetrics), a server with timeouts and graceful shutdown (httpserver), a
//     bearer token on the routes that change data by hand (bearer), its setting a
//     redacted envconfig.Secret read from a variable or a *_FILE (envconfig.SecretFromFile);
//   - PostgreSQL: pgdb (open, create and migrate with start-up retries; Transient; Wrap, the
//     adapters' error wrapping; DBTX, their query interface), pgmigrate (numbered SQL files applied once, then the
//     libraries' schemas), pgxpool statistics as metrics (pgxpoolmetrics), callbacks after a
//     commit (aftercommit);
//   - RabbitMQ: a service's topology, one shape of names for both (amqptopo.Names),
//     declared so that a changed setting never stops it (amqptopo); the dead-letters
//     subcommand of both binaries, which replays dead letters with filters and a dry run
//     (deadletters);
//   - tracing: OTLP export configured by the OTEL_* variables, off without an endpoint, and
//     the W3C propagator (telemetry), handed by service.Process to the HTTP edge, the relay,
//     the consumer and the stores; query spans inside traced work (pgtrace); trace_id and
//     span_id in the logs (logging.TraceHandler);
//   - slog set-up (logging), crash points for chaos tests (failpoint), and for tests: the
//     test servers (testinfra) and the metric contract check (metricstest).
//
// The libraries in pkg/ never import it: they stay copyable.
package internal

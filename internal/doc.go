// Package internal holds the pieces the services share, written once so that both services
// behave, and read, the same:
//
//   - the HTTP edge: the input policy (input: strict JSON, identifiers, header tokens, ids),
//     its application to requests, the request id and the Allow of a 405 (httpapi), RFC 9457
//     problem responses and their types (problem), readiness checks for /readyz (readiness),
//     HTTP metrics by route pattern (httpmetrics), a server with timeouts and graceful
//     shutdown (httpserver);
//   - PostgreSQL: opening a database with start-up retries and the classification of its
//     errors (pgdb), numbered SQL migrations applied once (pgmigrate), pgxpool statistics as
//     Prometheus metrics (pgxpoolmetrics), callbacks that run only after a transaction
//     committed (aftercommit);
//   - RabbitMQ: a service's topology, declared so that a changed setting never stops it
//     (amqptopo);
//   - slog set-up (logging), crash points for chaos tests (failpoint), and for tests: the
//     test servers (testinfra) and the metric contract check (metricstest).
//
// The libraries in pkg/ never import it: they stay copyable.
package internal

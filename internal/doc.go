// Package internal holds the pieces the services share: crash points for chaos tests
// (failpoint), RFC 9457 problem responses (problem), an HTTP server with timeouts and
// graceful shutdown (httpserver), slog set-up (logging), HTTP metrics by route pattern (httpmetrics), pgxpool statistics as Prometheus
// metrics (pgxpoolmetrics), numbered SQL migrations applied once (pgmigrate), callbacks that run only after a transaction committed
// (aftercommit), and for tests: the test servers (testinfra) and the metric contract check
// (metricstest). The libraries in pkg/ never import it: they stay copyable.
package internal

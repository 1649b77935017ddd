// Package internal holds the pieces the services share: crash points for chaos tests
// (failpoint), RFC 9457 problem responses (problem), an HTTP server with timeouts and
// graceful shutdown (httpserver), and slog set-up (logging). The libraries in pkg/ never
// import it: they stay copyable.
package internal

// Package logging builds the services' slog logger: JSON by default (for containers),
// text for a terminal, with the trace_id and span_id of the record's context
// ([TraceHandler]).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a logger writing to w in format "json" or "text" at level "debug", "info",
// "warn" or "error", with a service attribute on every line, and trace_id and span_id on
// every line logged with a context that carries a span ([TraceHandler]).
func New(w io.Writer, format, level, service string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "json", "":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q: want json or text", format)
	}
	return slog.New(NewTraceHandler(h)).With("service", service), nil
}

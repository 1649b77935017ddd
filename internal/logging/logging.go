// Package logging builds the services' slog logger: JSON by default (for containers),
// text for a terminal, with the trace_id and span_id of the record's context
// ([TraceHandler]), and durations written the same way in both formats ([DurationString]).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a logger writing to w in format "json" or "text" at level "debug", "info",
// "warn" or "error", with a service attribute on every line, trace_id and span_id on
// every line logged with a context that carries a span ([TraceHandler]), and every
// time.Duration attribute as its String ("13ms", "1m30s"; [DurationString]).
func New(w io.Writer, format, level, service string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: DurationString}
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

// DurationString is a slog.HandlerOptions.ReplaceAttr that writes a time.Duration value as
// its String ("13ms", "1m30s", "0s"), also inside groups. slog's JSON handler writes a
// duration as a number of nanoseconds ("waited":13000000), its text handler as the String
// already: with it the two formats agree, and a JSON line reads like the text one. Only
// attributes whose value is a duration change; a duration inside a struct logged with
// slog.Any is marshalled by encoding/json, as a number.
func DurationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

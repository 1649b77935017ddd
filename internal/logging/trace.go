package logging

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// TraceHandler is a slog.Handler that adds trace_id and span_id to every record whose
// context carries a valid span context (an HTTP request's server span, a consumer's process
// span), so that a log line leads to its trace. Log with the ...Context methods
// (InfoContext(ctx, …)) on request and message paths: a record without a context has no
// trace to name.
type TraceHandler struct{ slog.Handler }

// NewTraceHandler wraps h.
func NewTraceHandler(h slog.Handler) TraceHandler { return TraceHandler{Handler: h} }

// Handle adds the trace's attributes to r when its ctx has a span context, then hands it on.
func (h TraceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs returns the handler with attrs, still adding the trace's.
func (h TraceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return TraceHandler{Handler: h.Handler.WithAttrs(attrs)}
}

// WithGroup returns the handler with a group, still adding the trace's.
func (h TraceHandler) WithGroup(name string) slog.Handler {
	return TraceHandler{Handler: h.Handler.WithGroup(name)}
}

package bench

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing on and off, the same relay in the same run (issue: "tracing off stays within noise
// of tracing on"): off is what the services run without an OTLP endpoint — pkg/outbox with no
// TracerProvider, so the global no-op one; on is an SDK provider that samples every span and
// exports it in batches, as the services do with an endpoint, to an exporter that drops the
// spans, so that the row measures the relay's own cost of tracing and not a collector's.

// tracingOn is a tracer provider that records every span and exports it to nowhere, and the
// W3C propagator the services use. Its shutdown flushes the batcher.
func tracingOn() (trace.TracerProvider, propagation.TextMapPropagator, func(context.Context) error) {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(discardExporter{}),
	)
	return tp, propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), tp.Shutdown
}

// discardExporter drops every span it is given.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// tracingText names a row's tracing mode.
func tracingText(on bool) string {
	if on {
		return "tracing on (SDK, every span sampled, batch export)"
	}
	return "tracing off"
}

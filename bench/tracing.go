package bench

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is how a row's relay traces: the same relay in the same run, three ways.
type Tracing int

const (
	// TracingOff is what the services run without an OTLP endpoint: pkg/outbox given no
	// TracerProvider or Propagator, so the global ones, which nothing in the bench sets.
	TracingOff Tracing = iota
	// TracingNoop is tracing on, on OpenTelemetry's no-op provider, with the W3C propagator:
	// every span is started and ended, and records nothing. Within noise of TracingOff is
	// the promise that an adopter who does not trace pays nothing.
	TracingNoop
	// TracingSDK is an SDK provider that samples every span and exports it in batches, as
	// the services do with an endpoint, to an exporter that drops the spans, so that the row
	// measures the relay's own cost of tracing and not a collector's.
	TracingSDK
)

// tracer returns the provider and propagator of mode t (nil, nil for TracingOff) and what
// ends the provider (flushing the SDK's batcher).
func (t Tracing) tracer() (trace.TracerProvider, propagation.TextMapPropagator, func(context.Context) error) {
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	switch t {
	case TracingNoop:
		return noop.NewTracerProvider(), w3c, func(context.Context) error { return nil }
	case TracingSDK:
		tp := sdktrace.NewTracerProvider(
			sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithBatcher(discardExporter{}),
		)
		return tp, w3c, tp.Shutdown
	default:
		return nil, nil, func(context.Context) error { return nil }
	}
}

// discardExporter drops every span it is given.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// String names a row's tracing mode.
func (t Tracing) String() string {
	switch t {
	case TracingNoop:
		return "tracing on the no-op provider"
	case TracingSDK:
		return "tracing on (SDK, every span sampled, batch export)"
	default:
		return "tracing off"
	}
}

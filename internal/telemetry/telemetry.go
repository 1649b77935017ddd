// Package telemetry sets up the services' OpenTelemetry tracing: OTLP export configured by
// the standard OTEL_* environment variables, off unless an endpoint is set, and the W3C
// TraceContext and Baggage propagator.
//
// A service's cmd/ reads [Env] with [LoadEnv] (beside its Config: the variables keep the
// specification's names, without the service's prefix, as CHAOS_FAILPOINTS does), calls
// [New] once at start-up, hands [Telemetry.TracerProvider] and [Telemetry.Propagator] to
// the App through service.Options, and calls [Telemetry.Shutdown] when the App has
// stopped, which sends the spans still buffered.
//
// With no endpoint (neither OTEL_EXPORTER_OTLP_ENDPOINT nor
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none, New builds no SDK provider and no exporter (no goroutine, no
// connection): the tracer provider is a no-op one, which records nothing but still carries
// a trace context it is given, such as an incoming request's traceparent, to the events the
// request writes. New never sets OpenTelemetry's global provider or propagator: both are
// passed explicitly, so that two Apps in one test process do not share them.
//
// The SDK reads the rest of the OTEL_* variables itself: the exporter's headers, timeout,
// compression and certificates (OTEL_EXPORTER_OTLP_*), the sampler (OTEL_TRACES_SAMPLER,
// OTEL_TRACES_SAMPLER_ARG), the batch processor (OTEL_BSP_*), and the resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), over the service's own name.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxshop/outboxshop/internal/envconfig"
)

// Env are the OTEL_* variables this package reads to decide whether and how to export, as
// the OpenTelemetry specification names them ([LoadEnv]). The SDK reads them (and the other
// OTEL_* variables) from the environment itself: these fields are what [New] decides on,
// and what the services' variable lists name.
type Env struct {
	// Endpoint is the OTLP endpoint of every signal (http://collector:4318 for OTLP/HTTP,
	// collector:4317 for gRPC); TracesEndpoint the traces' own, which wins (for OTLP/HTTP
	// a full URL, …/v1/traces). Tracing is off while both are empty.
	Endpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	TracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"`
	// Protocol is http/protobuf (the default) or grpc; TracesProtocol the traces' own, which
	// wins. http/json is not supported by the Go exporters.
	Protocol       string `env:"OTEL_EXPORTER_OTLP_PROTOCOL"`
	TracesProtocol string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"`
	// ServiceName names the process in the traces; the service's name ("orders",
	// "warehouse") when empty. ResourceAttributes adds key=value pairs to the resource.
	ServiceName        string `env:"OTEL_SERVICE_NAME"`
	ResourceAttributes string `env:"OTEL_RESOURCE_ATTRIBUTES"`
	// TracesSampler and TracesSamplerArg choose the sampler (the SDK's default:
	// parentbased_always_on).
	TracesSampler    string `env:"OTEL_TRACES_SAMPLER"`
	TracesSamplerArg string `env:"OTEL_TRACES_SAMPLER_ARG"`
	// TracesExporter "none" turns export off; "otlp" (or empty) is the only other value.
	TracesExporter string `env:"OTEL_TRACES_EXPORTER"`
	// SDKDisabled turns the SDK off whatever the other variables say.
	SDKDisabled bool `env:"OTEL_SDK_DISABLED"`
}

// Protocols of the OTLP exporter.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Enabled reports whether e exports traces: an endpoint is set and neither the SDK nor the
// traces exporter is turned off.
func (e Env) Enabled() bool {
	return (e.Endpoint != "" || e.TracesEndpoint != "") && !e.SDKDisabled && !strings.EqualFold(e.TracesExporter, "none")
}

// protocol is the traces' OTLP protocol.
func (e Env) protocol() string {
	if e.TracesProtocol != "" {
		return e.TracesProtocol
	}
	if e.Protocol != "" {
		return e.Protocol
	}
	return ProtocolHTTP
}

// LoadEnv reads Env from environ (nil: the process environment) and validates it. The SDK
// reads the process environment: give environ only in tests, or the two may disagree.
func LoadEnv(environ map[string]string) (Env, error) { return envconfig.LoadValid[Env](environ) }

// Validate reports every OTEL_* setting that cannot work.
func (e Env) Validate() error {
	var v envconfig.Checks
	e.Check(&v)
	return v.Err()
}

// Check records in v every OTEL_* setting that cannot work, by its variable's name.
func (e Env) Check(v *envconfig.Checks) {
	if !e.Enabled() {
		return
	}
	p := e.protocol()
	v.Check(p == ProtocolHTTP || p == ProtocolGRPC,
		"OTEL_EXPORTER_OTLP_PROTOCOL (or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) must be %s or %s, is %q", ProtocolHTTP, ProtocolGRPC, p)
	v.Check(e.TracesExporter == "" || strings.EqualFold(e.TracesExporter, "otlp"),
		"OTEL_TRACES_EXPORTER must be otlp or none, is %q", e.TracesExporter)
}

// Propagator is the propagator of the services: W3C TraceContext (traceparent, tracestate)
// and W3C Baggage.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Telemetry is a process's tracing: an SDK provider exporting over OTLP when enabled, a
// no-op provider otherwise.
type Telemetry struct {
	provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider // nil when off
}

// FromEnv reads [Env] from environ (nil: the process's environment) and returns [New]'s
// tracing for service: what a service's main calls.
func FromEnv(ctx context.Context, environ map[string]string, service string) (*Telemetry, error) {
	e, err := LoadEnv(environ)
	if err != nil {
		return nil, err
	}
	return New(ctx, e, service)
}

// New returns the tracing of service (its default service.name) as e configures it. When
// e is not [Env.Enabled], it builds nothing and cannot fail. Otherwise it builds the OTLP
// exporter of e's protocol, which reads its endpoint and other settings from the
// environment, and a batching SDK provider; the exporter connects lazily, so a collector
// that is not up yet only delays the first export.
func New(ctx context.Context, e Env, service string) (*Telemetry, error) {
	if !e.Enabled() {
		return &Telemetry{provider: noop.NewTracerProvider()}, nil
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch e.protocol() {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	// The service's name first, so that OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// (WithFromEnv) override it.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER, the batching from OTEL_BSP_*: the SDK
	// reads them.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Telemetry{provider: tp, sdk: tp}, nil
}

// Enabled reports whether t exports spans.
func (t *Telemetry) Enabled() bool { return t.sdk != nil }

// TracerProvider is the provider to hand to the App (service.Options.TracerProvider).
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.provider }

// Propagator is the propagator to hand to the App (service.Options.Propagator): [Propagator].
func (t *Telemetry) Propagator() propagation.TextMapPropagator { return Propagator() }

// Shutdown sends the spans still buffered and stops the exporter, within ctx's deadline
// (give it the service's stop deadline). It does nothing when t is off.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t.sdk == nil {
		return nil
	}
	if err := t.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// Close is [Telemetry.Shutdown] bounded by timeout, logging a failure to log (nil
// discards): what a cmd/ defers after its App stopped.
func (t *Telemetry) Close(timeout time.Duration, log *slog.Logger) {
	if t.sdk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil && log != nil {
		log.WarnContext(ctx, "spans lost at shutdown", slog.Any("error", err))
	}
}

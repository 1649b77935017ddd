package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing runs each request under an OpenTelemetry server span (otelhttp, with e's
// TracerProvider and Propagator), a child of the trace context the request's traceparent
// carries. The span is named after the chi route pattern once the request is routed
// ("POST /orders", "GET /orders/{id}", with http.route), never after its path; a request no
// route matched keeps the method alone ("GET"). The operations routes, /healthz, /readyz
// and /metrics, get no span: probes and scrapes every few seconds would bury the requests.
// otelhttp's own metrics are not recorded (a no-op MeterProvider): the request metrics are
// the Metrics middleware's.
func (e Edge) Tracing(next http.Handler) http.Handler {
	named := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			span := trace.SpanFromContext(r.Context())
			span.SetName(r.Method + " " + rc.RoutePattern())
			span.SetAttributes(semconv.HTTPRoute(rc.RoutePattern()))
		}
	})
	prop := e.Propagator
	if prop == nil {
		prop = defaultPropagator
	}
	return otelhttp.NewHandler(named, "",
		otelhttp.WithTracerProvider(e.TracerProvider),
		otelhttp.WithPropagators(prop),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithFilter(func(r *http.Request) bool { return !isOps(r.URL.Path) }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
	)
}

// defaultPropagator is the W3C TraceContext and Baggage propagator.
var defaultPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// isOps reports whether path is an operations route: /healthz, /readyz, /metrics.
func isOps(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

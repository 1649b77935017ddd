package httpapi

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/readiness"
)

// DefaultRetryAfter is the Retry-After of a 503 answer.
const DefaultRetryAfter = 5 * time.Second

// Edge is what both services' routers put in front of their handlers, and how they answer an
// error: the request id, an access log line per request, the request metrics, a recoverer
// that turns a panic into a 500 problem, HEAD for every GET, and problem documents for
// not-found, method-not-allowed and every error a handler returns.
type Edge struct {
	// Problems maps the service's error codes to their answers.
	Problems problem.Table
	// Logger receives the access log and the failures. nil discards.
	Logger *slog.Logger
	// Params are the route parameters the log lines carry, by the attribute they become
	// ({"id": "order_id"}).
	Params map[string]string
	// RetryAfter is the Retry-After of a 503. Default DefaultRetryAfter.
	RetryAfter time.Duration
	// Metrics records every request (a route-pattern middleware, such as httpmetrics'). nil
	// records nothing.
	Metrics func(http.Handler) http.Handler
	// TracerProvider makes a server span per request (see [Edge.Tracing]); Propagator reads
	// the caller's trace context from the request's headers. nil TracerProvider: no
	// middleware at all; nil Propagator: W3C TraceContext and Baggage.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// NewRouter returns a chi router with e's middleware in order (tracing when e has a
// TracerProvider, request id, access log, metrics, recoverer, HEAD) and its not-found and
// method-not-allowed answers.
func (e Edge) NewRouter() chi.Router {
	r := chi.NewRouter()
	var mw []func(http.Handler) http.Handler
	if e.TracerProvider != nil {
		mw = append(mw, e.Tracing)
	}
	mw = append(mw, WithRequestID, e.AccessLog)
	if e.Metrics != nil {
		mw = append(mw, e.Metrics)
	}
	r.Use(append(mw, e.Recoverer, middleware.GetHead)...)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		e.Error(w, r, apperr.Errorf(apperr.CodeNotFound, "No resource at %s.", r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		SetAllow(w, r)
		problem.Write(w, r, problem.Details{Type: problem.TypeMethodNotAllowed, Title: "Method not allowed",
			Status: http.StatusMethodNotAllowed, Detail: fmt.Sprintf("%s is not allowed on %s.", r.Method, r.URL.Path)})
	})
	return r
}

// MountOps adds the operations routes to r: GET /healthz (200 {"status":"ok"} while the
// process answers), /readyz (internal/readiness over checks, each bounded by timeout, 0: its
// default; 503 with e's Retry-After when one is down) and /metrics (g; nil serves an empty
// registry; OpenMetrics, with exemplars, to a scraper that accepts it).
func (e Edge) MountOps(r chi.Router, g prometheus.Gatherer, checks []readiness.Check, timeout time.Duration) {
	if g == nil {
		g = prometheus.NewRegistry()
	}
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	r.Method(http.MethodGet, "/readyz", readiness.Handler(readiness.Config{
		Checks: checks, Timeout: timeout, RetryAfter: cmp.Or(e.RetryAfter, DefaultRetryAfter), Logger: e.log(),
	}))
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(e.log().Handler(), slog.LevelError),
		// OpenMetrics when the scraper asks for it (Prometheus does): the only format that
		// carries the latency histograms' exemplars (trace ids).
		EnableOpenMetrics: true,
	}))
}

func (e Edge) log() *slog.Logger { return cmp.Or(e.Logger, slog.New(slog.DiscardHandler)) }

// RetryAfterHeader is the value of e's Retry-After header: whole seconds, at least 1.
func (e Edge) RetryAfterHeader() string {
	d := cmp.Or(e.RetryAfter, DefaultRetryAfter)
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// attrs are the attributes of every log line about r: the request id, method and path, and
// the route parameters of Params.
func (e Edge) attrs(r *http.Request) []any {
	attrs := []any{slog.String("request_id", RequestID(r.Context())), slog.String("method", r.Method), slog.String("path", r.URL.Path)}
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		for param, attr := range e.Params {
			if v := rctx.URLParam(param); v != "" {
				attrs = append(attrs, slog.String(attr, v))
			}
		}
	}
	return attrs
}

// Error answers err as a problem document, by the code of its *apperr.Error (e.Problems).
// A 503 carries Retry-After and is logged as a warning, another 5xx as an error with its
// cause; a refusal of bad input (4xx) is logged at debug level only: a client's mistake pages
// no one.
func (e Edge) Error(w http.ResponseWriter, r *http.Request, err error) {
	d := e.Problems.Details(err)
	attrs := append(e.attrs(r), slog.Int("status", d.Status), slog.Any("error", err))
	switch {
	case d.Status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", e.RetryAfterHeader())
		e.log().WarnContext(r.Context(), "request failed: unavailable", attrs...)
	case d.Status >= 500:
		e.log().ErrorContext(r.Context(), "request failed", attrs...)
	default:
		e.log().DebugContext(r.Context(), "request refused", attrs...)
	}
	problem.Write(w, r, d)
}

// AccessLog logs one line per request, once it is answered: method, route pattern, path,
// status, duration, bytes, request id, the route parameters of Params, and the Location of a
// created resource. Probes and metrics scrapes (/healthz, /readyz, /metrics) are logged at
// debug level, the rest at info.
func (e Edge) AccessLog(next http.Handler) http.Handler {
	log := e.log()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		defer func() {
			route := "unmatched"
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
				route = rc.RoutePattern()
			}
			status := cmp.Or(ww.Status(), http.StatusOK)
			attrs := append(e.attrs(r), slog.String("route", route), slog.Int("status", status),
				slog.Duration("duration", time.Since(start)), slog.Int("bytes", ww.BytesWritten()))
			if loc := ww.Header().Get("Location"); loc != "" {
				attrs = append(attrs, slog.String("location", loc))
			}
			level := slog.LevelInfo
			if isOps(r.URL.Path) {
				level = slog.LevelDebug
			}
			log.Log(r.Context(), level, "http request", attrs...)
		}()
		next.ServeHTTP(ww, r)
	})
}

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

// Recoverer turns a panic in a handler into a logged 500 problem instead of a dropped
// connection, unless the answer was already started. http.ErrAbortHandler passes through.
func (e Edge) Recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			e.log().ErrorContext(r.Context(), "panic in handler", append(e.attrs(r),
				slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))...)
			if ww, ok := w.(middleware.WrapResponseWriter); ok && ww.Status() != 0 {
				return
			}
			e.Error(w, r, apperr.Wrap(apperr.CodeInternal, fmt.Errorf("panic: %v", v), apperr.InternalMessage))
		}()
		next.ServeHTTP(w, r)
	})
}

package httpapi

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"
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

// OpsRoutes says which operations routes [Edge.MountOps] adds to a router.
type OpsRoutes int

const (
	// AllOps are /healthz, /readyz and /metrics: the routes of a router that serves them
	// alone (the relay's port, <SERVICE>_OPS_ADDR's), and of the API's when the process has
	// no listener of its own for them (the default).
	AllOps OpsRoutes = iota
	// ProbesOnly are /healthz and /readyz, without /metrics, which answers 404 as any
	// unknown route: the API's router of a process that serves its operations routes on a
	// listener of their own (<SERVICE>_OPS_ADDR), so that the metrics are not exposed where
	// the API's clients are, while a health check of the API's port keeps working.
	ProbesOnly
)

// MountOps adds the operations routes of routes to r: GET /healthz (200 {"status":"ok"}
// while the process answers), /readyz (internal/readiness over checks, each bounded by
// timeout, 0: its default; 503 with e's Retry-After when one is down) and, for AllOps,
// /metrics (g; nil serves an empty registry; OpenMetrics, with exemplars, to a scraper that
// accepts it).
func (e Edge) MountOps(r chi.Router, routes OpsRoutes, g prometheus.Gatherer, checks []readiness.Check, timeout time.Duration) {
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	r.Method(http.MethodGet, "/readyz", readiness.Handler(readiness.Config{
		Checks: checks, Timeout: timeout, RetryAfter: cmp.Or(e.RetryAfter, DefaultRetryAfter), Logger: e.log(),
	}))
	if routes == ProbesOnly {
		return
	}
	if g == nil {
		g = prometheus.NewRegistry()
	}
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

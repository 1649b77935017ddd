// Package httpmetrics records the services' HTTP metrics by chi route pattern, never by raw path.
package httpmetrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// RouteUnmatched is the route label of a request no route matched (a 404 or 405 of the
// router): never the raw path, which would make a series per id.
const RouteUnmatched = "unmatched"

// Metrics are the HTTP metrics of docs/metrics.md: http_requests_total{route,method,code} and
// http_request_duration_seconds{route,method}, where route is the chi route pattern
// ("/orders/{id}"). Create them once per process and use Middleware on every router.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// New registers the HTTP metrics on reg; constLabels (say, service="orders") go on both.
func New(reg prometheus.Registerer, constLabels prometheus.Labels) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "http_requests_total", Help: "HTTP requests served, by route pattern, method and status code.",
			ConstLabels: constLabels,
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "http_request_duration_seconds", Help: "Time to serve an HTTP request, by route pattern and method.",
			ConstLabels: constLabels, Buckets: prometheus.DefBuckets,
		}, []string{"route", "method"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Middleware records every request once its handler returned, when the route pattern is
// known. A nil *Metrics records nothing. A request whose handler panicked with
// http.ErrAbortHandler (the connection is dropped, no answer) is not recorded.
//
// A request whose context carries a sampled span (the server span of a tracing middleware
// that runs before this one, such as otelhttp's) records its trace_id and span_id as the
// exemplar of its duration; Prometheus sees exemplars only in the OpenMetrics format.
func (m *Metrics) Middleware(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		route := RouteUnmatched
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		status := ww.Status()
		if status == 0 { // nothing written: net/http answers 200
			status = http.StatusOK
		}
		method := methodLabel(r.Method)
		m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		observe(m.duration.WithLabelValues(route, method), time.Since(start).Seconds(), trace.SpanContextFromContext(r.Context()))
	})
}

// Exemplar labels: the trace and span of a request served under a sampled span.
const (
	ExemplarTraceID = "trace_id"
	ExemplarSpanID  = "span_id"
)

// observe records v on h, with the trace and span ids of sc as its exemplar when sc is
// sampled. Without a sampled span it is a plain Observe: nothing allocated.
func observe(h prometheus.Observer, v float64, sc trace.SpanContext) {
	if sc.IsSampled() {
		if eo, ok := h.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{
				ExemplarTraceID: sc.TraceID().String(), ExemplarSpanID: sc.SpanID().String(),
			})
			return
		}
	}
	h.Observe(v)
}

// methodLabel bounds the method label: a client can send any token as a method.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

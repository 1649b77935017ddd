package httpmetrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/httpmetrics"
)

// sampled is the context of a sampled span.
var sampled = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

// setup is a router measured by the middleware, and its registry.
func setup(t *testing.T) (http.Handler, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := httpmetrics.New(reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	r := chi.NewRouter()
	r.Use(m.Middleware)
	r.Get("/orders/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return r, reg
}

// serve sends GET path to h with ctx.
func serve(ctx context.Context, h http.Handler, path string) {
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil))
}

func TestExemplars(t *testing.T) {
	t.Parallel()

	t.Run("a request under a sampled span carries its trace and span ids", func(t *testing.T) {
		t.Parallel()
		h, reg := setup(t)
		serve(trace.ContextWithSpanContext(context.Background(), sampled), h, "/orders/1")
		unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
		serve(trace.ContextWithSpanContext(context.Background(), unsampled), h, "/orders/2")

		ex := exemplars(t, reg)
		require.Len(t, ex, 1, "only the sampled span's request")
		labels := map[string]string{}
		for _, l := range ex[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, map[string]string{
			httpmetrics.ExemplarTraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
			httpmetrics.ExemplarSpanID:  "00f067aa0ba902b7",
		}, labels)
	})

	t.Run("without a span no exemplar", func(t *testing.T) {
		t.Parallel()
		h, reg := setup(t)
		serve(context.Background(), h, "/orders/1")
		require.Empty(t, exemplars(t, reg))
	})

	t.Run("the exemplar reaches an OpenMetrics scrape", func(t *testing.T) {
		t.Parallel()
		h, reg := setup(t)
		serve(trace.ContextWithSpanContext(context.Background(), sampled), h, "/orders/1")
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}).ServeHTTP(rec, req)
		require.Contains(t, rec.Header().Get("Content-Type"), "application/openmetrics-text")
		// The exemplar's labels come from a map: client_golang writes them in either order.
		require.Regexp(t, `(?m)^http_request_duration_seconds_bucket\{.*\} 1 # \{(`+
			`span_id="00f067aa0ba902b7",trace_id="4bf92f3577b34da6a3ce929d0e0e4736"|`+
			`trace_id="4bf92f3577b34da6a3ce929d0e0e4736",span_id="00f067aa0ba902b7")\} `, rec.Body.String())
	})
}

// exemplars returns the exemplars of http_request_duration_seconds.
func exemplars(t *testing.T, g prometheus.Gatherer) []*dto.Exemplar {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "http_request_duration_seconds" {
			continue
		}
		var out []*dto.Exemplar
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if e := b.GetExemplar(); e != nil {
					out = append(out, e)
				}
			}
		}
		return out
	}
	t.Fatal("no http_request_duration_seconds")
	return nil
}

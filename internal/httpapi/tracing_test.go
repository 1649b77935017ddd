package httpapi_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/logging"
	"github.com/outboxshop/outboxshop/internal/problem"
)

func TestEdgeTracing(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (chi.Router, *tracetest.SpanRecorder, *bytes.Buffer) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
		var logs bytes.Buffer
		log := slog.New(logging.NewTraceHandler(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		e := httpapi.Edge{Problems: problem.Shared(), Logger: log, TracerProvider: tp, Propagator: propagation.TraceContext{}}
		r := e.NewRouter()
		r.Post("/orders/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
			log.InfoContext(r.Context(), "cancelling")
			w.WriteHeader(http.StatusAccepted)
		})
		e.MountOps(r, httpapi.AllOps, nil, nil, 0)
		return r, rec, &logs
	}
	serve := func(h http.Handler, method, path string, headers ...string) int {
		req := httptest.NewRequest(method, path, nil)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}

	t.Run("ServerSpanNamedAfterTheRoute", func(t *testing.T) {
		t.Parallel()
		r, rec, logs := setup(t)
		tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		require.Equal(t, http.StatusAccepted, serve(r, http.MethodPost, "/orders/0192e0a4-0000-7000-8000-000000000001/cancel", "traceparent", tp))
		spans := rec.Ended()
		require.Len(t, spans, 1)
		s := spans[0]
		require.Equal(t, "POST /orders/{id}/cancel", s.Name(), "the route pattern, never the path")
		require.Equal(t, trace.SpanKindServer, s.SpanKind())
		require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String(), "the caller's trace")
		require.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String(), "a child of the caller's span")
		require.True(t, s.Parent().IsRemote())
		attrs := attribute.NewSet(s.Attributes()...)
		route, ok := attrs.Value("http.route")
		require.True(t, ok)
		require.Equal(t, "/orders/{id}/cancel", route.AsString())
		status, ok := attrs.Value("http.response.status_code")
		require.True(t, ok)
		require.EqualValues(t, http.StatusAccepted, status.AsInt64())

		// The handler's log line and the access log carry the server span's ids.
		lines := logLines(t, logs)
		require.Len(t, lines, 2)
		for _, l := range lines {
			require.Equal(t, s.SpanContext().TraceID().String(), l["trace_id"], "%v", l)
			require.Equal(t, s.SpanContext().SpanID().String(), l["span_id"], "%v", l)
		}
	})

	t.Run("UnmatchedRouteKeepsTheMethodAlone", func(t *testing.T) {
		t.Parallel()
		r, rec, _ := setup(t)
		require.Equal(t, http.StatusNotFound, serve(r, http.MethodGet, "/no/such/path/42"))
		spans := rec.Ended()
		require.Len(t, spans, 1)
		require.Equal(t, "GET", spans[0].Name(), "a path never becomes a span name")
	})

	t.Run("OpsRoutesHaveNoSpan", func(t *testing.T) {
		t.Parallel()
		r, rec, logs := setup(t)
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			require.Equal(t, http.StatusOK, serve(r, http.MethodGet, path), path)
		}
		require.Empty(t, rec.Ended())
		for _, l := range logLines(t, logs) {
			require.NotContains(t, l, "trace_id", "no span, no trace id: %v", l)
		}
	})

	t.Run("NoTracerProviderNoMiddleware", func(t *testing.T) {
		t.Parallel()
		var logs bytes.Buffer
		e := httpapi.Edge{Logger: slog.New(logging.NewTraceHandler(slog.NewJSONHandler(&logs, nil)))}
		r := e.NewRouter()
		r.Get("/x", func(w http.ResponseWriter, r *http.Request) {
			require.False(t, trace.SpanContextFromContext(r.Context()).IsValid(), "no trace context is read")
		})
		require.Equal(t, http.StatusOK, serve(r, http.MethodGet, "/x", "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
		require.NotContains(t, logs.String(), "trace_id")
	})
}

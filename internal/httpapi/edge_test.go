package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/readiness"
)

// logLines decodes the JSON log lines in buf.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		lines = append(lines, m)
	}
	return lines
}

// setupEdge returns a router on an Edge logging to the returned buffer at debug level, with
// routes that answer, fail with err and panic.
func setupEdge(t *testing.T) (http.Handler, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	e := httpapi.Edge{
		Problems: problem.Table{
			apperr.CodeValidation:  {Status: http.StatusUnprocessableEntity, Type: problem.TypeValidation, Title: "Invalid"},
			apperr.CodeUnavailable: {Status: http.StatusServiceUnavailable, Type: problem.TypeUnavailable, Title: "Unavailable"},
		},
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Params: map[string]string{"id": "thing_id"},
	}
	r := e.NewRouter()
	r.Get("/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/things/1")
		w.WriteHeader(http.StatusCreated)
	})
	r.Post("/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("fail") {
		case "validation":
			e.Error(w, r, &apperr.Error{Code: apperr.CodeValidation, Message: "Bad fields.",
				Fields: []apperr.FieldError{{Field: "name", Message: "is required"}}})
		case "unavailable":
			e.Error(w, r, apperr.Wrap(apperr.CodeUnavailable, errors.New("connection refused"), "Try again."))
		case "plain":
			e.Error(w, r, errors.New("secret detail"))
		case "panic":
			panic("secret panic")
		}
	})
	r.Get("/healthz", func(http.ResponseWriter, *http.Request) {})
	return r, &logs
}

func serve(h http.Handler, method, target string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec
}

func decodeProblem(t *testing.T, rec *httptest.ResponseRecorder) problem.Details {
	t.Helper()
	require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
	var d problem.Details
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	return d
}

func TestEdge(t *testing.T) {
	t.Parallel()

	t.Run("AccessLog", func(t *testing.T) {
		t.Parallel()
		h, logs := setupEdge(t)
		rec := serve(h, http.MethodGet, "/things/42")
		require.Equal(t, http.StatusCreated, rec.Code)
		require.NotEmpty(t, rec.Header().Get(httpapi.HeaderRequestID))
		serve(h, http.MethodGet, "/healthz")
		lines := logLines(t, logs)
		require.Len(t, lines, 2)
		require.Equal(t, "http request", lines[0]["msg"])
		require.Equal(t, "INFO", lines[0]["level"])
		require.Equal(t, "/things/{id}", lines[0]["route"])
		require.Equal(t, "/things/42", lines[0]["path"])
		require.Equal(t, "42", lines[0]["thing_id"])
		require.Equal(t, float64(201), lines[0]["status"])
		require.Equal(t, "/things/1", lines[0]["location"])
		require.Equal(t, rec.Header().Get(httpapi.HeaderRequestID), lines[0]["request_id"])
		require.Contains(t, lines[0], "duration")
		require.Equal(t, "DEBUG", lines[1]["level"], "probes at debug level")
	})

	t.Run("ErrorsByTable", func(t *testing.T) {
		t.Parallel()
		h, logs := setupEdge(t)
		d := decodeProblem(t, serve(h, http.MethodPost, "/things/1?fail=validation"))
		require.Equal(t, problem.Details{Type: problem.TypeValidation, Title: "Invalid", Status: 422, Detail: "Bad fields.",
			Instance: "/things/1", Errors: []problem.FieldError{{Field: "name", Message: "is required"}}}, d)

		rec := serve(h, http.MethodPost, "/things/1?fail=unavailable")
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Equal(t, "5", rec.Header().Get("Retry-After"))
		require.Equal(t, "Try again.", decodeProblem(t, rec).Detail)

		rec = serve(h, http.MethodPost, "/things/1?fail=plain")
		require.Equal(t, http.StatusInternalServerError, rec.Code)
		d = decodeProblem(t, rec)
		require.Equal(t, problem.TypeInternal, d.Type)
		require.Equal(t, apperr.InternalMessage, d.Detail, "the cause is for the log only")

		levels := map[string]string{}
		for _, l := range logLines(t, logs) {
			if l["msg"] != "http request" {
				levels[l["msg"].(string)] = l["level"].(string)
			}
		}
		require.Equal(t, map[string]string{"request refused": "DEBUG", "request failed: unavailable": "WARN", "request failed": "ERROR"}, levels)
	})

	t.Run("Recoverer", func(t *testing.T) {
		t.Parallel()
		h, logs := setupEdge(t)
		rec := serve(h, http.MethodPost, "/things/1?fail=panic")
		require.Equal(t, http.StatusInternalServerError, rec.Code)
		require.NotContains(t, rec.Body.String(), "secret panic")
		require.Contains(t, logs.String(), `"msg":"panic in handler"`)
		require.Contains(t, logs.String(), "secret panic")
	})

	t.Run("NotFoundAndMethodNotAllowed", func(t *testing.T) {
		t.Parallel()
		h, _ := setupEdge(t)
		rec := serve(h, http.MethodGet, "/nothing")
		require.Equal(t, http.StatusInternalServerError, rec.Code, "the table has no not_found row: internal")
		rec = serve(h, http.MethodDelete, "/things/1")
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
		require.Equal(t, []string{"GET", "HEAD", "POST"}, rec.Header().Values("Allow"))
		require.Equal(t, problem.TypeMethodNotAllowed, decodeProblem(t, rec).Type)
	})

	t.Run("Ops", func(t *testing.T) {
		t.Parallel()
		e := httpapi.Edge{}
		r := e.NewRouter()
		down := errors.New("refused")
		e.MountOps(r, httpapi.AllOps, nil, []readiness.Check{{Name: "database", Check: func(context.Context) error { return down }}}, time.Second)
		rec := serve(r, http.MethodGet, "/healthz")
		require.Equal(t, http.StatusOK, rec.Code)
		require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
		rec = serve(r, http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Equal(t, "5", rec.Header().Get("Retry-After"))
		require.Equal(t, http.StatusOK, serve(r, http.MethodGet, "/metrics").Code)
		// OpenMetrics to a scraper that asks for it (the format that carries exemplars).
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
		rec = httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Contains(t, rec.Header().Get("Content-Type"), "application/openmetrics-text")
	})

	t.Run("ProbesOnly", func(t *testing.T) {
		t.Parallel()
		e := httpapi.Edge{Problems: problem.Shared()}
		r := e.NewRouter()
		e.MountOps(r, httpapi.ProbesOnly, prometheus.NewRegistry(), nil, time.Second)
		require.Equal(t, http.StatusOK, serve(r, http.MethodGet, "/healthz").Code)
		require.Equal(t, http.StatusOK, serve(r, http.MethodGet, "/readyz").Code)
		rec := serve(r, http.MethodGet, "/metrics")
		require.Equal(t, http.StatusNotFound, rec.Code, "the metrics are served on a listener of their own")
		require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
		require.Equal(t, problem.TypeNotFound, decodeProblem(t, rec).Type)
	})

	t.Run("Head", func(t *testing.T) {
		t.Parallel()
		h, _ := setupEdge(t)
		require.Equal(t, http.StatusCreated, serve(h, http.MethodHead, "/things/1").Code)
	})
}

package readiness_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/readiness"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type answer struct {
	problem.Details
	Checks map[string]string `json:"checks"`
}

func probe(t *testing.T, h http.Handler) (*httptest.ResponseRecorder, answer) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var a answer
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a), rec.Body.String())
	return rec, a
}

func TestHandler(t *testing.T) {
	t.Parallel()

	t.Run("ready lists every check", func(t *testing.T) {
		t.Parallel()
		h := readiness.Handler(readiness.Config{Checks: []readiness.Check{
			{Name: "database", Check: func(context.Context) error { return nil }},
			{Name: "consumer", Check: func(context.Context) error { return nil }},
		}})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		require.JSONEq(t, `{"status":"ready","checks":{"database":"up","consumer":"up"}}`, rec.Body.String())
	})

	t.Run("not ready is a 503 problem with every reason", func(t *testing.T) {
		t.Parallel()
		logs := &bytes.Buffer{}
		h := readiness.Handler(readiness.Config{
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Checks: []readiness.Check{
				{Name: "database", Check: readiness.Ping(func(context.Context) error { return errors.New("dial tcp: refused") })},
				{Name: "consumer", Check: func(context.Context) error { return nil }},
				{Name: "relay", Check: func(context.Context) error { panic("bug") }},
			}})
		for range 3 {
			rec, a := probe(t, h)
			require.Equal(t, http.StatusServiceUnavailable, rec.Code)
			require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
			require.Equal(t, "5", rec.Header().Get("Retry-After"))
			require.Equal(t, problem.TypeNotReady, a.Type)
			require.Equal(t, http.StatusServiceUnavailable, a.Status)
			require.Contains(t, a.Detail, "database: ")
			require.Contains(t, a.Detail, "relay: ")
			require.NotContains(t, a.Detail, "refused", "a ping's error stays in the process")
			require.Equal(t, "up", a.Checks["consumer"])
			require.True(t, strings.HasPrefix(a.Checks["database"], "down: "))
		}
		require.Equal(t, 1, strings.Count(logs.String(), "not ready"), "a line per change, not per probe")
	})

	// A connection check's reason says for how long it has been down, so it changes from
	// probe to probe: the log still gets one line when the process becomes not ready, one
	// when other checks fail, and one when it is ready again.
	t.Run("a line per change of the failing checks, not per probe", func(t *testing.T) {
		t.Parallel()
		logs := &bytes.Buffer{}
		var probes, dbDown atomic.Int32
		dbDown.Store(-1)
		h := readiness.Handler(readiness.Config{
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Checks: []readiness.Check{
				{Name: "consumer", Check: func(context.Context) error {
					if n := probes.Load(); n < 10 {
						return fmt.Errorf("disconnected from the broker for %ds (more than 1s)", n+2)
					}
					return nil
				}},
				{Name: "database", Check: func(context.Context) error {
					if probes.Load() == dbDown.Load() {
						return errors.New("does not answer")
					}
					return nil
				}},
			}})
		dbDown.Store(5)
		for n := range 12 {
			probes.Store(int32(n))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, n < 10, rec.Code == http.StatusServiceUnavailable, "probe %d", n)
		}
		out := logs.String()
		require.Equal(t, 3, strings.Count(out, "not ready"), "consumer down; consumer and database; consumer again:\n%s", out)
		require.Equal(t, 1, strings.Count(out, "ready again"), out)
		require.Contains(t, out, "failed_probes=10")
		require.Contains(t, out, "not_ready_for=")
	})

	t.Run("a check that does not answer in time is down", func(t *testing.T) {
		t.Parallel()
		h := readiness.Handler(readiness.Config{Timeout: 50 * time.Millisecond, Checks: []readiness.Check{
			{Name: "database", Check: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		}})
		rec, a := probe(t, h)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Contains(t, a.Checks["database"], "no answer within 50ms")
	})
}

// TestReady: a component's own readiness, asked with the grace, is the check's answer.
func TestReady(t *testing.T) {
	t.Parallel()
	var asked time.Duration
	down := errors.New("cannot publish to the broker for 41s (since 2026-01-02T03:04:05Z): outbox: broker unavailable: dial: refused")
	answer := error(nil)
	check := readiness.Ready(func(maxUnavailable time.Duration) error {
		asked = maxUnavailable
		return answer
	}, 30*time.Second)
	require.NoError(t, check(context.Background()))
	require.Equal(t, 30*time.Second, asked, "the grace is the component's to apply")
	answer = down
	require.Equal(t, down, check(context.Background()))

	h := readiness.Handler(readiness.Config{Checks: []readiness.Check{{Name: "relay", Check: check}}})
	rec, a := probe(t, h)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "down: "+down.Error(), a.Checks["relay"])
}

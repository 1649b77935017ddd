package http_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/telemetry"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// bundle is an API test's world: the real router on an httptest server, in front of the
// real repository on a fresh, migrated database.
type bundle struct {
	pool    *pgxpool.Pool
	store   *postgres.Store
	srv     *httptest.Server
	logs    *logBuffer
	commits *counter             // AfterCommit calls
	reg     *prometheus.Registry // the HTTP metrics
}

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) inc() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events", Propagator: telemetry.Propagator()})
	require.NoError(t, err)
	b := &bundle{pool: pool, store: store, logs: &logBuffer{}, commits: &counter{}, reg: prometheus.NewPedanticRegistry()}
	metrics, err := ordershttp.NewMetrics(b.reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	b.srv = httptest.NewServer(ordershttp.NewHandler(ordershttp.Config{
		Orders:      store,
		Metrics:     metrics,
		Logger:      slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		AfterCommit: b.commits.inc,
		// Tracing off, as a service runs without an OTLP endpoint: no spans, but the
		// caller's trace context still reaches the events.
		TracerProvider: noop.NewTracerProvider(),
		Propagator:     telemetry.Propagator(),
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// response is a received answer with its body read.
type response struct {
	*http.Response
	body []byte
}

func (r response) problem(t *testing.T) problem.Details {
	t.Helper()
	require.Equal(t, problem.ContentType, r.Header.Get("Content-Type"), "body: %s", r.body)
	var d problem.Details
	require.NoError(t, json.Unmarshal(r.body, &d), "body: %s", r.body)
	require.Equal(t, r.StatusCode, d.Status)
	require.NotEmpty(t, d.Type)
	require.NotEmpty(t, d.Title)
	return d
}

func (r response) order(t *testing.T) orderJSON {
	t.Helper()
	require.Equal(t, "application/json", r.Header.Get("Content-Type"), "body: %s", r.body)
	var o orderJSON
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&o), "body: %s", r.body)
	return o
}

// orderJSON is the API's order representation, as a client reads it.
type orderJSON struct {
	ID         string `json:"id"`
	CustomerID string `json:"customer_id"`
	Status     string `json:"status"`
	Items      []struct {
		SKU      string `json:"sku"`
		Name     string `json:"name"`
		Quantity int    `json:"quantity"`
	} `json:"items"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
	History   []struct {
		From      string `json:"from"`
		Status    string `json:"status"`
		Event     string `json:"event"`
		Reason    string `json:"reason"`
		MessageID string `json:"message_id"`
		At        string `json:"at"`
	} `json:"history"`
}

// do sends a request to the test server. headers are "Name: value" strings.
func (b *bundle) do(t *testing.T, method, path, body string, headers ...string) response {
	t.Helper()
	return b.send(t, method, path, strings.NewReader(body), headers...)
}

// doChunked sends the body without a Content-Length (chunked), so that only reading it tells
// its size.
func (b *bundle) doChunked(t *testing.T, method, path, body string, headers ...string) response {
	t.Helper()
	return b.send(t, method, path, struct{ io.Reader }{strings.NewReader(body)}, headers...)
}

func (b *bundle) send(t *testing.T, method, path string, body io.Reader, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, body)
	require.NoError(t, err)
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		require.True(t, ok, h)
		req.Header.Add(name, strings.TrimSpace(value))
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp, data}
}

const jsonCT = "Content-Type: application/json"

// post creates an order.
func (b *bundle) post(t *testing.T, body string, headers ...string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/orders", body, append([]string{jsonCT}, headers...)...)
}

func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

// logBuffer collects JSON log lines safely from concurrent handlers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// levels returns the decoded log lines of level ("ERROR", "WARN", …).
func (l *logBuffer) levels(t *testing.T, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range l.all(t) {
		if m["level"] == level {
			out = append(out, m)
		}
	}
	return out
}

// lines returns the decoded log lines whose msg is msg.
func (l *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range l.all(t) {
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// all returns every decoded log line.
func (l *logBuffer) all(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	data := append([]byte(nil), l.buf.Bytes()...)
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		out = append(out, m)
	}
	return out
}

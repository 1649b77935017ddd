// Package http is the orders service's HTTP API on chi: POST /orders, GET /orders/{id},
// POST /orders/{id}/cancel, /healthz, /readyz and /metrics, with a request-id middleware, an
// access log, request metrics by route pattern ([Metrics]) and RFC 9457 problem answers
// (application/problem+json) for every error.
//
// Input follows the policy both services share (internal/input, internal/httpapi): a body
// is application/json in UTF-8 (415 otherwise), at most MaxRequestBytes (413), one
// JSON object without duplicate or unknown members, field names spelled exactly (400);
// identifiers without control or bidirectional formatting characters (422); an
// Idempotency-Key of 1 to 255 bytes of visible ASCII (400); an order id in its canonical
// form, a lowercase hyphenated UUID (404 for any other spelling); a 405 lists the allowed
// methods in Allow. None of them writes anything, none is logged as an error.
//
// /readyz checks the database and the dependencies the process adds (Config.Checks): 200
// when all are up, else a 503 problem listing each (internal/readiness).
package http

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/services/orders"
)

// OrderService is what the API needs from the repository. *postgres.Store implements it.
type OrderService interface {
	// CreateOrder writes the order and its OrderCreated event in one transaction (see
	// orders.CreateOrderInput for the idempotency contract).
	CreateOrder(ctx context.Context, in orders.CreateOrderInput) (orders.CreateOrderResult, error)
	// Order returns an order or an CodeNotFound error.
	Order(ctx context.Context, id uuid.UUID) (*orders.Order, error)
	// CancelOrder requests a cancellation (see orders.Cancel).
	CancelOrder(ctx context.Context, id uuid.UUID, meta orders.EventMeta) (*orders.Order, error)
	// Ping checks the database.
	Ping(ctx context.Context) error
}

// Config configures the API handler.
type Config struct {
	// Orders is the repository. Required.
	Orders OrderService
	// Gatherer is served on /metrics. nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Metrics records every request (NewMetrics). nil records nothing.
	Metrics *Metrics
	// Logger receives the access log and the errors. nil discards.
	Logger *slog.Logger
	// AfterCommit is called after the transaction of a POST /orders that created an order
	// committed, before the answer is written (the api.after-commit crash point). Optional.
	AfterCommit func()
	// Checks are /readyz's dependencies besides the database, which is always checked (the
	// stock consumer's broker connection, say).
	Checks []readiness.Check
	// Ops are the operations routes served beside the API: httpapi.AllOps (the default:
	// /healthz, /readyz, /metrics), or httpapi.ProbesOnly when the process serves them on a
	// listener of their own (internal/service Listeners.APIOps), and /metrics answers 404
	// here.
	Ops httpapi.OpsRoutes
	// DatabaseTimeout bounds the database work of one request; past it the answer is 503.
	// Default 5s.
	DatabaseTimeout time.Duration
	// RetryAfter is the Retry-After of 503 answers. Default 5s.
	RetryAfter time.Duration
	// TracerProvider makes a server span per API request, named after its route
	// (internal/httpapi Edge.Tracing); Propagator reads the caller's traceparent. nil
	// TracerProvider: no spans, and no trace context is read from the request.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// Handler serves the API.
type Handler struct {
	router      chi.Router
	orders      OrderService
	log         *slog.Logger
	edge        httpapi.Edge
	afterCommit func()
	dbTimeout   time.Duration
}

// NewHandler returns the API handler.
func NewHandler(cfg Config) *Handler {
	h := &Handler{
		orders:      cfg.Orders,
		log:         cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		afterCommit: cfg.AfterCommit,
		dbTimeout:   cmp.Or(cfg.DatabaseTimeout, 5*time.Second),
	}
	h.edge = edge(h.log, cfg.RetryAfter, cfg.Metrics)
	h.edge.TracerProvider, h.edge.Propagator = cfg.TracerProvider, cfg.Propagator
	r := h.edge.NewRouter()
	r.Post("/orders", h.createOrder)
	r.Get("/orders/{id}", h.getOrder)
	r.Post("/orders/{id}/cancel", h.cancelOrder)
	checks := append([]readiness.Check{{Name: "database", Check: readiness.Ping(cfg.Orders.Ping)}}, cfg.Checks...)
	h.edge.MountOps(r, cfg.Ops, cfg.Gatherer, checks, min(h.dbTimeout, readiness.DefaultTimeout))
	h.router = r
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.router.ServeHTTP(w, r) }

// OpsConfig configures NewOpsHandler.
type OpsConfig struct {
	// Gatherer is served on /metrics. nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Metrics records every request (NewMetrics). nil records nothing.
	Metrics *Metrics
	// Checks are /readyz's dependencies (the database, the relay). None: always ready.
	Checks []readiness.Check
	// Logger receives the access log. nil discards.
	Logger *slog.Logger
}

// NewOpsHandler returns a handler with only /healthz, /readyz and /metrics, for the processes
// that serve no API (the relay) and for the operations listener of an API process
// (ORDERS_OPS_ADDR).
func NewOpsHandler(cfg OpsConfig) http.Handler {
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	e := edge(log, 0, cfg.Metrics)
	r := e.NewRouter()
	e.MountOps(r, httpapi.AllOps, cfg.Gatherer, cfg.Checks, 0)
	return r
}

// edge is the middleware and the error answers of both handlers (internal/httpapi).
func edge(log *slog.Logger, retryAfter time.Duration, m *Metrics) httpapi.Edge {
	return httpapi.Edge{Problems: problems, Logger: log, Params: map[string]string{"id": "order_id"}, RetryAfter: retryAfter, Metrics: m.Middleware}
}

// problems maps each error code to its HTTP status and problem type: the one place where
// that mapping lives (the shared codes' rows are internal/problem's; the orders service
// retitles CodeValidation and CodeConflict). StatusCode reads it.
var problems = problem.Shared().With(problem.Table{
	orders.CodeValidation:       {Status: http.StatusUnprocessableEntity, Type: problem.TypeValidation, Title: "The order is not valid"},
	orders.CodeConflict:         {Status: http.StatusConflict, Type: problem.TypePrefix + "order-state-conflict", Title: "The order's status does not allow this"},
	orders.CodeIdempotencyReuse: {Status: http.StatusUnprocessableEntity, Type: problem.TypePrefix + "idempotency-key-reuse", Title: "Idempotency-Key reused with a different request"},
})

// StatusCode returns the HTTP status of an error code (500 for an unknown code).
func StatusCode(code orders.Code) int { return problems.Status(code) }

// error answers err as a problem document.
func (h *Handler) error(w http.ResponseWriter, r *http.Request, err error) { h.edge.Error(w, r, err) }

// writeJSON answers v as application/json.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // our own types always marshal
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	writeBody(w, status, append(body, '\n'))
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Package http is the warehouse's HTTP API, on chi:
//
//	GET  /stock                    a page of SKUs in SKU order: ?limit=1..1000 (100), ?cursor=
//	                               from the previous page's "next"
//	GET  /stock/{sku}              one SKU (404 when unknown), with its ETag
//	PUT  /stock/{sku}              set the available stock: If-Match with the ETag of GET
//	                               (412 when the SKU changed since, 428 without), or
//	                               If-None-Match: * to create a new SKU
//	GET  /reservations/{order_id}  what the warehouse did for an order, with its lines
//	GET  /healthz                  liveness: the process answers
//	GET  /readyz                   readiness: the database and Config.Checks (503 when not)
//	GET  /metrics                  Prometheus metrics
//
// Every request is counted by route pattern ("/stock/{sku}", never the SKU itself), method and
// status code, and timed, when Config.Metrics is set ([Metrics]).
//
// # Input
//
// The input policy is the one both services share (internal/input, internal/httpapi): a body
// is application/json in UTF-8 (415 otherwise), at most Config.MaxBodyBytes (413), one JSON
// object without duplicate or unknown members, with field names spelled exactly (400); a
// field of the wrong type or out of range, a name with control or bidirectional formatting
// characters, is a 422 naming the field; an order id is a lowercase hyphenated UUID (404 for
// any other spelling); a 405 lists the allowed methods in Allow.
//
// Errors are RFC 9457 problem documents (application/problem+json). Bad input is never a
// 500, never logged as an error, and writes nothing. When the database cannot be reached the
// answer is 503 with Retry-After. Every response carries X-Request-ID (the caller's, or a new
// one).
//
// # Concurrent writes
//
// A reservation changes a SKU's stock at any moment. PUT /stock/{sku} therefore requires the
// ETag the caller read (If-Match): when the SKU changed since, the answer is 412 and nothing
// is written, so an operator never overwrites a reservation made between their read and their
// write. If-Match: * sets the level whatever it is now (a stock-take), If-None-Match: *
// creates a SKU that must not exist yet.
package http

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// Pinger checks that the database answers, for /readyz.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Store is what the API needs from the database. Errors are *warehouse.Error where the
// caller can act on them (CodeNotFound, CodePreconditionFailed, CodeUnavailable); anything
// else is a 500.
type Store interface {
	Pinger
	// ListStock returns up to limit SKUs after the SKU after, in SKU order.
	ListStock(ctx context.Context, after string, limit int) ([]warehouse.StockItem, error)
	GetStock(ctx context.Context, sku string) (warehouse.StockItem, error)
	// SetStockIf sets available (and the name, when not empty) when the SKU satisfies pre,
	// creating the SKU when new, and reports whether it did.
	SetStockIf(ctx context.Context, sku, name string, available int64, pre warehouse.Precondition) (warehouse.StockItem, bool, error)
	GetReservation(ctx context.Context, orderID uuid.UUID) (warehouse.Reservation, error)
}

// Defaults and bounds of [Config] and of the stock list.
const (
	DefaultDBTimeout    = 5 * time.Second
	DefaultMaxBodyBytes = 16 << 10
	// RetryAfterSeconds is the Retry-After of a 503.
	RetryAfterSeconds = 5
	// DefaultPageSize and MaxPageSize bound GET /stock's limit.
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Config configures [NewRouter].
type Config struct {
	// Store serves the stock and reservation routes. When nil, only /healthz, /readyz and
	// /metrics are served (the relay's port).
	Store Store
	// Pinger is checked by /readyz as "database". Default Store.
	Pinger Pinger
	// Checks are /readyz's other dependencies (the consumer's broker connection, the relay).
	Checks []readiness.Check
	// Gatherer is served on /metrics. Default: an empty registry.
	Gatherer prometheus.Gatherer
	// Metrics records every request (NewMetrics). nil records nothing.
	Metrics *Metrics
	// DBTimeout bounds the database work of one request. Default 5s.
	DBTimeout time.Duration
	// MaxBodyBytes bounds a request body. Default 16 KiB.
	MaxBodyBytes int64
	// Logger receives a line per request and the causes of 5xx answers. nil discards.
	Logger *slog.Logger
}

type server struct {
	cfg Config
	log *slog.Logger
}

// NewRouter returns the API's handler.
func NewRouter(cfg Config) http.Handler {
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, DefaultDBTimeout)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	if cfg.Pinger == nil && cfg.Store != nil {
		cfg.Pinger = cfg.Store
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	s := &server{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))}

	r := chi.NewRouter()
	r.Use(httpapi.WithRequestID, s.accessLog, cfg.Metrics.Middleware, s.recoverer, middleware.GetHead)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed)

	var checks []readiness.Check
	if cfg.Pinger != nil {
		checks = append(checks, readiness.Check{Name: "database", Check: readiness.Ping(cfg.Pinger.Ping)})
	}
	r.Get("/healthz", s.healthz)
	r.Method(http.MethodGet, "/readyz", readiness.Handler(readiness.Config{
		Checks: append(checks, cfg.Checks...), Timeout: min(cfg.DBTimeout, readiness.DefaultTimeout),
		RetryAfter: RetryAfterSeconds * time.Second, Logger: s.log,
	}))
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError),
	}))
	if cfg.Store != nil {
		r.Get("/stock", s.listStock)
		r.Get("/stock/{sku}", s.getStock)
		r.Put("/stock/{sku}", s.putStock)
		r.Get("/reservations/{order_id}", s.getReservation)
	}
	return r
}

// problemKind is how one error code is answered.
type problemKind struct {
	status int
	typ    string
	title  string
}

// problems maps each error code to its HTTP status and problem type: the one place where that
// mapping lives.
var problems = map[warehouse.Code]problemKind{
	warehouse.CodeInvalid:              {http.StatusBadRequest, problem.TypeMalformedBody, "The request body could not be read"},
	warehouse.CodeValidation:           {http.StatusUnprocessableEntity, problem.TypeValidation, "The request has invalid fields"},
	warehouse.CodeNotFound:             {http.StatusNotFound, problem.TypeNotFound, "Not found"},
	warehouse.CodeConflict:             {http.StatusConflict, problem.TypeConflict, "Conflict with the current state"},
	warehouse.CodeTooLarge:             {http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge, "The request body is too large"},
	warehouse.CodeUnsupportedMediaType: {http.StatusUnsupportedMediaType, problem.TypeUnsupportedMediaType, "The request body must be application/json in UTF-8"},
	warehouse.CodeBadHeader:            {http.StatusBadRequest, problem.TypeInvalidHeader, "A request header is invalid"},
	warehouse.CodeBadQuery:             {http.StatusBadRequest, problem.TypeInvalidQuery, "A query parameter is invalid"},
	warehouse.CodePreconditionFailed:   {http.StatusPreconditionFailed, problem.TypePreconditionFailed, "The SKU changed since it was read"},
	warehouse.CodePreconditionRequired: {http.StatusPreconditionRequired, problem.TypePreconditionRequired, "If-Match is required"},
	warehouse.CodeUnavailable:          {http.StatusServiceUnavailable, problem.TypeUnavailable, "Service unavailable"},
	warehouse.CodeInternal:             {http.StatusInternalServerError, problem.TypeInternal, "Internal server error"},
}

// statusOf maps a domain error code to its HTTP status (500 for an unknown code).
func statusOf(code warehouse.Code) int {
	if p, ok := problems[code]; ok {
		return p.status
	}
	return http.StatusInternalServerError
}

// fail answers err as a problem document; 5xx causes are logged, 503s carry Retry-After.
// Refusals of bad input (4xx) are logged at debug level only: a client's mistake pages no one.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	kind, ok := problems[warehouse.ErrorCode(err)]
	if !ok {
		kind = problems[warehouse.CodeInternal]
	}
	switch {
	case kind.status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		s.log.WarnContext(r.Context(), "request failed: database unavailable", requestAttr(r), slog.Any("error", err))
	case kind.status >= 500:
		s.log.ErrorContext(r.Context(), "request failed", requestAttr(r), slog.Any("error", err))
	default:
		s.log.DebugContext(r.Context(), "request refused", requestAttr(r), slog.Int("status", kind.status), slog.Any("error", err))
	}
	d := problem.Details{Type: kind.typ, Title: kind.title, Status: kind.status, Detail: warehouse.ErrorMessage(err)}
	for _, f := range warehouse.ErrorFields(err) {
		d.Errors = append(d.Errors, problem.FieldError{Field: f.Field, Message: f.Message})
	}
	problem.Write(w, r, d)
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, warehouse.Errorf(warehouse.CodeNotFound, "No route for %s %s.", r.Method, r.URL.Path))
}

// methodNotAllowed answers 405 with the Allow header (internal/httpapi).
func (s *server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	httpapi.SetAllow(w, r)
	problem.Write(w, r, problem.Details{Type: problem.TypeMethodNotAllowed, Title: "Method not allowed",
		Status: http.StatusMethodNotAllowed, Detail: "Method " + r.Method + " is not allowed on " + r.URL.Path + "."})
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

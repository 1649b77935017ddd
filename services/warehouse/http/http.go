// Package http is the warehouse's HTTP API, on chi:
//
//	GET  /stock                    every SKU: sku, name, available, reserved
//	GET  /stock/{sku}              one SKU (404 when unknown)
//	PUT  /stock/{sku}              set the available stock, creating the SKU when new
//	GET  /reservations/{order_id}  what the warehouse did for an order, with its lines
//	GET  /healthz                  liveness: the process answers
//	GET  /readyz                   readiness: the database answers (503 when not)
//	GET  /metrics                  Prometheus metrics
//
// Every request is counted by route pattern ("/stock/{sku}", never the SKU itself), method and
// status code, and timed, when Config.Metrics is set ([Metrics]).
//
// Errors are RFC 9457 problem documents (application/problem+json). Bad input is never a
// 500: malformed JSON, unknown fields or trailing data are 400, values out of range 422, a
// body over the limit 413, a body that is not JSON 415. When the database cannot be reached
// the answer is 503 with Retry-After. Every response carries X-Request-ID (the caller's, or a
// new one).
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

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// Pinger checks that the database answers, for /readyz.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Store is what the API needs from the database. Errors are *warehouse.Error where the
// caller can act on them (CodeNotFound, CodeUnavailable); anything else is a 500.
type Store interface {
	Pinger
	ListStock(ctx context.Context) ([]warehouse.StockItem, error)
	GetStock(ctx context.Context, sku string) (warehouse.StockItem, error)
	// SetStock sets available (and the name, when not empty), creating the SKU when new,
	// and reports whether it did.
	SetStock(ctx context.Context, sku, name string, available int64) (warehouse.StockItem, bool, error)
	GetReservation(ctx context.Context, orderID uuid.UUID) (warehouse.Reservation, error)
}

// Defaults of [Config].
const (
	DefaultDBTimeout    = 5 * time.Second
	DefaultMaxBodyBytes = 16 << 10
	// RetryAfterSeconds is the Retry-After of a 503.
	RetryAfterSeconds = 5
)

// Config configures [NewRouter].
type Config struct {
	// Store serves the stock and reservation routes. When nil, only /healthz, /readyz and
	// /metrics are served (the relay's port).
	Store Store
	// Pinger is checked by /readyz. Default Store; when both are nil /readyz always answers
	// ready.
	Pinger Pinger
	// Gatherer is served on /metrics. Default: an empty registry.
	Gatherer prometheus.Gatherer
	// Metrics records every request (NewMetrics). nil records nothing.
	Metrics *Metrics
	// Status, when set, adds informational checks to /readyz's body (e.g. "consumer":
	// "connected"); they do not change its status code.
	Status func() map[string]string
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
	r.Use(requestID, s.accessLog, cfg.Metrics.Middleware, s.recoverer, middleware.GetHead)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed)

	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
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

// statusOf maps a domain error code to its HTTP status: the one place where that happens.
func statusOf(code warehouse.Code) int {
	switch code {
	case warehouse.CodeInvalid:
		return http.StatusBadRequest
	case warehouse.CodeValidation:
		return http.StatusUnprocessableEntity
	case warehouse.CodeNotFound:
		return http.StatusNotFound
	case warehouse.CodeConflict:
		return http.StatusConflict
	case warehouse.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case warehouse.CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case warehouse.CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// fail answers err as a problem document; 5xx causes are logged, 503s carry Retry-After.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(warehouse.ErrorCode(err))
	switch {
	case status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		s.log.WarnContext(r.Context(), "request failed: database unavailable", requestAttr(r), slog.Any("error", err))
	case status >= 500:
		s.log.ErrorContext(r.Context(), "request failed", requestAttr(r), slog.Any("error", err))
	}
	d := problem.Details{Status: status, Detail: warehouse.ErrorMessage(err)}
	for _, f := range warehouse.ErrorFields(err) {
		d.Errors = append(d.Errors, problem.FieldError{Field: f.Field, Message: f.Message})
	}
	problem.Write(w, r, d)
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, warehouse.Errorf(warehouse.CodeNotFound, "No route for %s %s.", r.Method, r.URL.Path))
}

// methodNotAllowed answers 405 with the Allow header chi's own handler would have set.
func (s *server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.Routes != nil {
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete} {
			if rctx.Routes.Match(chi.NewRouteContext(), m, r.URL.Path) {
				allowed = append(allowed, m)
				if m == http.MethodGet {
					allowed = append(allowed, http.MethodHead)
				}
			}
		}
	}
	for _, m := range allowed {
		w.Header().Add("Allow", m)
	}
	problem.Write(w, r, problem.Details{Status: http.StatusMethodNotAllowed,
		Detail: "Method " + r.Method + " is not allowed on " + r.URL.Path + "."})
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

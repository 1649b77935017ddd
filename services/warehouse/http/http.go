// Package http is the warehouse's HTTP API, on chi:
//
//	GET  /stock                    a page of SKUs in SKU order: ?limit=1..1000 (100), ?cursor=
//	                               from the previous page's "next"
//	GET  /stock/{sku}              one SKU (404 when unknown), with its ETag
//	PUT  /stock/{sku}              set the available stock (admin: the bearer token): If-Match
//	                               with the ETag of GET (412 when the SKU changed since, 428
//	                               without), or If-None-Match: * to create a new SKU
//	GET  /reservations/{order_id}  what the warehouse did for an order, with its lines
//	GET  /healthz                  liveness: the process answers
//	GET  /readyz                   readiness: the database and Config.Checks (503 when not)
//	GET  /metrics                  Prometheus metrics (on the operations listener alone when
//	                               WAREHOUSE_OPS_ADDR is set: Config.Ops)
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
// # Admin routes
//
// PUT /stock/{sku} is the one route that changes data outside the saga, and it is an admin
// route: it requires Authorization: Bearer with Config.AdminToken (internal/bearer). Without
// it, or with a malformed one, the answer is 401 with WWW-Authenticate: Bearer
// realm="warehouse-admin"; with another token, 401 with error="invalid_token"; while no token
// is configured, 403: the admin API is disabled until an operator sets one. The other routes
// read, and stay open. The token is in no log line, problem document, span or metric.
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
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/bearer"
	"github.com/outboxshop/outboxshop/internal/envconfig"
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
	// Ops are the operations routes served beside the API: httpapi.AllOps (the default:
	// /healthz, /readyz, /metrics), or httpapi.ProbesOnly when the process serves them on a
	// listener of their own (internal/service Listeners.APIOps), and /metrics answers 404
	// here.
	Ops httpapi.OpsRoutes
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
	// TracerProvider makes a server span per API request, named after its route
	// (internal/httpapi Edge.Tracing); Propagator reads the caller's traceparent. nil
	// TracerProvider: no spans.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	// AdminToken guards the admin routes (PUT /stock/{sku}): a request must send it as
	// Authorization: Bearer. Empty disables them (403). Checked by the caller
	// (bearer.Check); only its digest is kept.
	AdminToken envconfig.Secret
}

// AdminRealm is the realm of the admin routes' WWW-Authenticate challenge.
const AdminRealm = "warehouse-admin"

// AdminDisabled is the detail of the 403 of an admin route while no token is configured.
const AdminDisabled = "the admin API is disabled: set WAREHOUSE_ADMIN_TOKEN or WAREHOUSE_ADMIN_TOKEN_FILE"

type server struct {
	cfg  Config
	log  *slog.Logger
	edge httpapi.Edge
}

// NewRouter returns the API's handler.
func NewRouter(cfg Config) http.Handler {
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, DefaultDBTimeout)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	if cfg.Pinger == nil && cfg.Store != nil {
		cfg.Pinger = cfg.Store
	}
	// The guard keeps the admin token's digest; nothing else holds the token.
	adminToken := cfg.AdminToken
	cfg.AdminToken = ""
	s := &server{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
	s.edge = httpapi.Edge{
		Problems: problems, Logger: s.log, Params: map[string]string{"order_id": "order_id", "sku": "sku"},
		RetryAfter: RetryAfterSeconds * time.Second, Metrics: cfg.Metrics.Middleware,
		TracerProvider: cfg.TracerProvider, Propagator: cfg.Propagator,
	}
	r := s.edge.NewRouter()
	admin := bearer.New(bearer.Config{Token: adminToken.Reveal(), Realm: AdminRealm, Disabled: AdminDisabled, Error: s.edge.Error})

	var checks []readiness.Check
	if cfg.Pinger != nil {
		checks = append(checks, readiness.Check{Name: "database", Check: readiness.Ping(cfg.Pinger.Ping)})
	}
	s.edge.MountOps(r, cfg.Ops, cfg.Gatherer, append(checks, cfg.Checks...), min(cfg.DBTimeout, readiness.DefaultTimeout))
	if cfg.Store != nil {
		r.Get("/stock", s.listStock)
		r.Get("/stock/{sku}", s.getStock)
		r.With(admin.Require).Put("/stock/{sku}", s.putStock)
		r.Get("/reservations/{order_id}", s.getReservation)
	}
	return r
}

// problems maps each error code to its HTTP status and problem type: the one place where that
// mapping lives (the shared codes' rows are internal/problem's).
var problems = problem.Shared().With(problem.Table{
	warehouse.CodeBadQuery:             {Status: http.StatusBadRequest, Type: problem.TypeInvalidQuery, Title: "A query parameter is invalid"},
	warehouse.CodePreconditionFailed:   {Status: http.StatusPreconditionFailed, Type: problem.TypePreconditionFailed, Title: "The SKU changed since it was read"},
	warehouse.CodePreconditionRequired: {Status: http.StatusPreconditionRequired, Type: problem.TypePreconditionRequired, Title: "If-Match is required"},
})

// StatusCode returns the HTTP status of an error code (500 for an unknown code).
func StatusCode(code warehouse.Code) int { return problems.Status(code) }

// fail answers err as a problem document (internal/httpapi Edge.Error): 5xx causes are
// logged, 503s carry Retry-After, refusals of bad input are logged at debug level only.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) { s.edge.Error(w, r, err) }

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

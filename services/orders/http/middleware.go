package http

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/services/orders"
)

// HeaderRequestID carries the request id in both directions. It becomes the correlation id of
// the events the request writes.
const HeaderRequestID = httpapi.HeaderRequestID

// RequestID returns the request id stored in ctx by the middleware (internal/httpapi), or "".
func RequestID(ctx context.Context) string { return httpapi.RequestID(ctx) }

// accessLog logs one line per request: method, route pattern, status, duration, request id.
func accessLog(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			defer func() {
				route := "unmatched"
				if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
					route = rc.RoutePattern()
				}
				status := ww.Status()
				if status == 0 {
					status = http.StatusOK
				}
				attrs := []any{
					"method", r.Method, "route", route, "status", status,
					"duration", time.Since(start), "bytes", ww.BytesWritten(),
					"request_id", RequestID(r.Context()),
				}
				if id := chi.URLParam(r, "id"); id != "" {
					attrs = append(attrs, "order_id", id)
				}
				if id := ww.Header().Get("Location"); id != "" {
					attrs = append(attrs, "location", id)
				}
				log.InfoContext(r.Context(), "http request", attrs...)
			}()
			next.ServeHTTP(ww, r)
		})
	}
}

// recoverer turns a panic into a logged 500 problem, unless the answer was already started.
func recoverer(log *slog.Logger, retryAfter string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				log.ErrorContext(r.Context(), "panic in handler", "request_id", RequestID(r.Context()),
					"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				if ww, ok := w.(middleware.WrapResponseWriter); ok && ww.Status() != 0 {
					return
				}
				writeError(w, r, log, retryAfter, orders.Errorf(orders.EINTERNAL, "Internal error."))
			}()
			next.ServeHTTP(w, r)
		})
	}
}

package http

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// HeaderRequestID carries the request id, in and out.
const HeaderRequestID = httpapi.HeaderRequestID

// RequestID returns the id of the request ctx belongs to (internal/httpapi), or "".
func RequestID(ctx context.Context) string { return httpapi.RequestID(ctx) }

func requestAttr(r *http.Request) slog.Attr {
	return slog.String("request_id", RequestID(r.Context()))
}

// accessLog logs one line per request: probes and metrics at debug level, the API at info.
func (s *server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		level := slog.LevelInfo
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			level = slog.LevelDebug
		}
		status := ww.Status()
		if status == 0 {
			status = http.StatusOK
		}
		attrs := []any{requestAttr(r),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status),
			slog.Int("bytes", ww.BytesWritten()), slog.Duration("took", time.Since(start))}
		if rctx := chi.RouteContext(r.Context()); rctx != nil {
			// The router filled in the route's parameters by now.
			if id := rctx.URLParam("order_id"); id != "" {
				attrs = append(attrs, slog.String("order_id", id))
			}
			if sku := rctx.URLParam("sku"); sku != "" {
				attrs = append(attrs, slog.String("sku", sku))
			}
		}
		s.log.Log(r.Context(), level, "http request", attrs...)
	})
}

// recoverer turns a panic in a handler into a logged 500 problem, not a dropped connection.
func (s *server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			rec := recover()
			if rec == nil || rec == http.ErrAbortHandler {
				if rec != nil {
					panic(rec)
				}
				return
			}
			s.log.ErrorContext(r.Context(), "handler panicked", requestAttr(r),
				slog.Any("panic", rec), slog.String("stack", string(debug.Stack())))
			s.fail(w, r, &warehouse.Error{Code: warehouse.CodeInternal, Message: "An internal error occurred.",
				Err: fmt.Errorf("panic: %v", rec)})
		}()
		next.ServeHTTP(w, r)
	})
}

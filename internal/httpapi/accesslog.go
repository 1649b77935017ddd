package httpapi

import (
	"cmp"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

// AccessLog logs one line per request, once it is answered: method, route pattern, path,
// status, duration, bytes, request id, the route parameters of Params, and the Location of a
// created resource. Probes and metrics scrapes (/healthz, /readyz, /metrics) are logged at
// debug level, the rest at info.
func (e Edge) AccessLog(next http.Handler) http.Handler {
	log := e.log()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		defer func() {
			route := "unmatched"
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
				route = rc.RoutePattern()
			}
			status := cmp.Or(ww.Status(), http.StatusOK)
			attrs := append(e.attrs(r), slog.String("route", route), slog.Int("status", status),
				slog.Duration("duration", time.Since(start)), slog.Int("bytes", ww.BytesWritten()))
			if loc := ww.Header().Get("Location"); loc != "" {
				attrs = append(attrs, slog.String("location", loc))
			}
			level := slog.LevelInfo
			if isOps(r.URL.Path) {
				level = slog.LevelDebug
			}
			log.Log(r.Context(), level, "http request", attrs...)
		}()
		next.ServeHTTP(ww, r)
	})
}

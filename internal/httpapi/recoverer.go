package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/outboxshop/outboxshop/internal/apperr"
)

// Recoverer turns a panic in a handler into a logged 500 problem instead of a dropped
// connection, unless the answer was already started. http.ErrAbortHandler passes through.
func (e Edge) Recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			e.log().ErrorContext(r.Context(), "panic in handler", append(e.attrs(r),
				slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))...)
			if ww, ok := w.(middleware.WrapResponseWriter); ok && ww.Status() != 0 {
				return
			}
			e.Error(w, r, apperr.Wrap(apperr.CodeInternal, fmt.Errorf("panic: %v", v), apperr.InternalMessage))
		}()
		next.ServeHTTP(w, r)
	})
}

package httpapi

import (
	"context"
	"net/http"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/input"
)

// HeaderRequestID carries the request id in both directions; it becomes the correlation id of
// the events a request writes.
const HeaderRequestID = "X-Request-ID"

// MaxRequestIDBytes bounds a client's X-Request-ID; a longer or odd one is replaced.
const MaxRequestIDBytes = 128

type requestIDKey struct{}

// RequestID returns the request id that [WithRequestID] stored in ctx, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// WithRequestID takes the client's X-Request-ID when it is 1 to MaxRequestIDBytes bytes of
// visible ASCII and makes a new one (a UUIDv7) otherwise, stores it in the request's context
// and echoes it in the answer.
func WithRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !input.VisibleASCII(id, MaxRequestIDBytes) {
			id = newRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

func newRequestID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString()
}

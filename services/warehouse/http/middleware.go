package http

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/outboxshop/outboxshop/internal/httpapi"
)

// HeaderRequestID carries the request id, in and out.
const HeaderRequestID = httpapi.HeaderRequestID

// RequestID returns the id of the request ctx belongs to (internal/httpapi), or "".
func RequestID(ctx context.Context) string { return httpapi.RequestID(ctx) }

func requestAttr(r *http.Request) slog.Attr {
	return slog.String("request_id", RequestID(r.Context()))
}

package http

import (
	"context"

	"github.com/outboxshop/outboxshop/internal/httpapi"
)

// HeaderRequestID carries the request id in both directions. It becomes the correlation id of
// the events the request writes.
const HeaderRequestID = httpapi.HeaderRequestID

// RequestID returns the request id stored in ctx by the middleware (internal/httpapi), or "".
func RequestID(ctx context.Context) string { return httpapi.RequestID(ctx) }

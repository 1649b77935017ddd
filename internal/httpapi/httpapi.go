// Package httpapi is the HTTP edge both services' routers share, one concern per file:
//
//   - [Edge] (edge.go): the router with the middleware below in order, the operations routes
//     (/healthz, /readyz, /metrics) and the problem documents of errors, 404 and 405;
//   - [WithRequestID] (requestid.go): the request id, echoed and put in the context;
//   - [Edge.AccessLog] (accesslog.go): one log line per answered request;
//   - [Edge.Tracing] (tracing.go): a server span per routed request;
//   - [Edge.Recoverer] (recoverer.go): a panic answered as a 500 problem;
//   - [ReadJSON], [DecodeJSON], [Token] and [SetAllow] (this file): the input policy of
//     internal/input applied to request bodies and headers, and the Allow header of a 405.
//
// Refusals are *input.Error values, which each service answers as a problem document with its
// own error codes.
package httpapi

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/outboxshop/outboxshop/internal/input"
)

// ReadJSON reads the body of a request that must carry JSON. It refuses, with an
// *input.Error, a Content-Type other than application/json or a charset other than utf-8
// (UnsupportedMediaType), and a body over maxBytes (TooLarge: before reading a byte when
// Content-Length says so, else as soon as the limit is crossed).
func ReadJSON(w http.ResponseWriter, r *http.Request, maxBytes int64) ([]byte, error) {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		if ct == "" {
			ct = "none"
		}
		return nil, input.Errorf(input.UnsupportedMediaType, "The body must be sent as Content-Type: application/json, not %s.", ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return nil, input.Errorf(input.UnsupportedMediaType, "The body must be UTF-8 (charset=utf-8), not charset=%s.", cs)
	}
	if r.ContentLength > maxBytes {
		return nil, input.Errorf(input.TooLarge, "The body is larger than %d bytes.", maxBytes)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, &input.Error{Kind: input.TooLarge, Message: fmt.Sprintf("The body is larger than %d bytes.", maxBytes), Err: err}
	}
	if err != nil {
		return nil, &input.Error{Kind: input.Malformed, Message: "The body could not be read.", Err: err}
	}
	return data, nil
}

// DecodeJSON reads the body with [ReadJSON] and decodes it into v with input.DecodeJSON:
// one JSON object with exactly v's fields.
func DecodeJSON(w http.ResponseWriter, r *http.Request, maxBytes int64, v any) error {
	data, err := ReadJSON(w, r, maxBytes)
	if err != nil {
		return err
	}
	return input.DecodeJSON(data, v, input.DecodeOptions{})
}

// Token reads an optional header that must be a token: sent at most once, 1 to maxBytes
// bytes of visible ASCII (input.VisibleASCII). ok is false when the header is absent. A
// header that breaks the rule is a BadHeader *input.Error.
func Token(r *http.Request, name string, maxBytes int) (value string, ok bool, err error) {
	values := r.Header.Values(name)
	switch {
	case len(values) == 0:
		return "", false, nil
	case len(values) > 1:
		return "", false, input.Errorf(input.BadHeader, "Send at most one %s header.", name)
	case values[0] == "":
		return "", false, input.Errorf(input.BadHeader, "The %s header is empty.", name)
	case len(values[0]) > maxBytes:
		return "", false, input.Errorf(input.BadHeader, "The %s header is longer than %d bytes.", name, maxBytes)
	case !input.VisibleASCII(values[0], maxBytes):
		return "", false, input.Errorf(input.BadHeader,
			"The %s header must be visible ASCII characters (0x21 to 0x7E): no spaces, control characters or other bytes.", name)
	}
	return values[0], true, nil
}

// routedMethods are the methods the Allow header can list.
var routedMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// SetAllow sets the Allow header of a 405 answer to r: the methods the router has a route for
// at r's path, with HEAD wherever GET is (middleware.GetHead answers it). Call it from the
// router's MethodNotAllowed handler.
func SetAllow(w http.ResponseWriter, r *http.Request) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return
	}
	path := rctx.RoutePath
	if path == "" {
		path = r.URL.RawPath
	}
	if path == "" {
		path = r.URL.Path
	}
	for _, m := range routedMethods {
		if rctx.Routes.Match(chi.NewRouteContext(), m, path) {
			w.Header().Add("Allow", m) // one line per method, as chi's own 405 does
			if m == http.MethodGet {
				w.Header().Add("Allow", http.MethodHead)
			}
		}
	}
}

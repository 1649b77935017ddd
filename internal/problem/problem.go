// Package problem writes HTTP errors as RFC 9457 problem details (application/problem+json).
package problem

import (
	"encoding/json"
	"net/http"
)

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// TypePrefix starts the type URI of every problem the services answer with.
const TypePrefix = "urn:outboxshop:problem:"

// The problem types both services use, one per kind of failure; each service adds its own
// for its domain (an order whose status forbids a cancel, say).
const (
	TypeMalformedBody        = TypePrefix + "malformed-body"         // 400: not the JSON accepted
	TypeValidation           = TypePrefix + "validation"             // 422: fields with values not accepted
	TypeBodyTooLarge         = TypePrefix + "body-too-large"         // 413
	TypeUnsupportedMediaType = TypePrefix + "unsupported-media-type" // 415: not application/json in UTF-8
	TypeInvalidHeader        = TypePrefix + "invalid-header"         // 400: a header breaks the input policy
	TypeInvalidQuery         = TypePrefix + "invalid-query"          // 400: a query parameter is not accepted
	TypeNotFound             = TypePrefix + "not-found"              // 404
	TypeMethodNotAllowed     = TypePrefix + "method-not-allowed"     // 405, with Allow
	TypeConflict             = TypePrefix + "conflict"               // 409
	TypePreconditionFailed   = TypePrefix + "precondition-failed"    // 412: If-Match did not match
	TypePreconditionRequired = TypePrefix + "precondition-required"  // 428: If-Match missing
	TypeUnavailable          = TypePrefix + "unavailable"            // 503, with Retry-After
	TypeNotReady             = TypePrefix + "not-ready"              // 503 of /readyz
	TypeInternal             = TypePrefix + "internal"               // 500
)

// Details is a problem document. Type defaults to "about:blank" and Title to the status text.
type Details struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists field-level problems of a request body, when there are any.
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Write answers with d.
func Write(w http.ResponseWriter, r *http.Request, d Details) {
	if d.Type == "" {
		d.Type = "about:blank"
	}
	if d.Title == "" {
		d.Title = http.StatusText(d.Status)
	}
	if d.Instance == "" && r != nil {
		d.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(d.Status)
	_ = json.NewEncoder(w).Encode(d)
}

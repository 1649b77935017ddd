// Package problem writes HTTP errors as RFC 9457 problem details (application/problem+json),
// and maps a service's error codes (internal/apperr) to them through one [Table].
package problem

import (
	"encoding/json"
	"maps"
	"net/http"

	"github.com/outboxshop/outboxshop/internal/apperr"
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
	TypeUnauthorized         = TypePrefix + "unauthorized"           // 401, with WWW-Authenticate
	TypeForbidden            = TypePrefix + "forbidden"              // 403
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

// Kind is how one error code is answered: the status, the problem type and its title.
type Kind struct {
	Status int
	Type   string
	Title  string
}

// Table maps each error code of a service to its answer: the one place where a service says
// which status a code is. A code missing from the table is answered as [Internal].
type Table map[apperr.Code]Kind

// Internal is the answer of an error whose code the table does not have.
var Internal = Kind{Status: http.StatusInternalServerError, Type: TypeInternal, Title: "Internal server error"}

// Shared returns the answers of the codes both services use (internal/apperr). A service's
// table is Shared().With(its own rows), which may also give a shared code another title or
// type.
func Shared() Table {
	return Table{
		apperr.CodeInvalid:              {Status: http.StatusBadRequest, Type: TypeMalformedBody, Title: "The request body could not be read"},
		apperr.CodeValidation:           {Status: http.StatusUnprocessableEntity, Type: TypeValidation, Title: "The request has invalid fields"},
		apperr.CodeTooLarge:             {Status: http.StatusRequestEntityTooLarge, Type: TypeBodyTooLarge, Title: "The request body is too large"},
		apperr.CodeUnsupportedMediaType: {Status: http.StatusUnsupportedMediaType, Type: TypeUnsupportedMediaType, Title: "The request body must be application/json in UTF-8"},
		apperr.CodeBadHeader:            {Status: http.StatusBadRequest, Type: TypeInvalidHeader, Title: "A request header is invalid"},
		apperr.CodeNotFound:             {Status: http.StatusNotFound, Type: TypeNotFound, Title: "Not found"},
		apperr.CodeConflict:             {Status: http.StatusConflict, Type: TypeConflict, Title: "Conflict with the current state"},
		apperr.CodeUnauthorized:         {Status: http.StatusUnauthorized, Type: TypeUnauthorized, Title: "Authentication required"},
		apperr.CodeForbidden:            {Status: http.StatusForbidden, Type: TypeForbidden, Title: "Forbidden"},
		apperr.CodeUnavailable:          {Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Title: "Service unavailable"},
		apperr.CodeInternal:             Internal,
	}
}

// With returns a copy of t with rows added, or replacing t's rows of the same codes.
func (t Table) With(rows Table) Table {
	out := make(Table, len(t)+len(rows))
	maps.Copy(out, t)
	maps.Copy(out, rows)
	return out
}

// Kind returns the answer of code: its row, or [Internal].
func (t Table) Kind(code apperr.Code) Kind {
	if k, ok := t[code]; ok {
		return k
	}
	return Internal
}

// Status returns the HTTP status of code (500 for a code the table does not have).
func (t Table) Status(code apperr.Code) int { return t.Kind(code).Status }

// Details returns the problem document of err, by the code of its *apperr.Error: status,
// type and title from the table, the caller-facing message as detail, and the field errors.
func (t Table) Details(err error) Details {
	k := t.Kind(apperr.ErrorCode(err))
	d := Details{Type: k.Type, Title: k.Title, Status: k.Status, Detail: apperr.ErrorMessage(err)}
	for _, f := range apperr.ErrorFields(err) {
		d.Errors = append(d.Errors, FieldError{Field: f.Field, Message: f.Message})
	}
	return d
}

package orders

import (
	"errors"
	"fmt"

	"github.com/outboxshop/outboxshop/internal/input"
)

// Error codes of the service. The http package maps each to one HTTP status in one function
// (http.StatusCode); everything else only looks at the code.
const (
	EINVALID          = "invalid"           // the request breaks a rule (field errors in Fields)
	EMALFORMED        = "malformed"         // the request body is not the JSON we accept
	ETOOLARGE         = "too_large"         // the request body is over the limit
	EUNSUPPORTED      = "unsupported_media" // the request body is not application/json
	EBADHEADER        = "bad_header"        // a request header is invalid
	ENOTFOUND         = "not_found"         // no such order
	ECONFLICT         = "conflict"          // the order's status does not allow the action
	EIDEMPOTENCYREUSE = "idempotency_reuse" // an Idempotency-Key was reused with another body
	EUNAVAILABLE      = "unavailable"       // the database cannot be reached; try again later
	EINTERNAL         = "internal"          // a bug, or an error nobody expected
)

// Error is the service's error: a code, a message safe to show to the client, the field errors
// of an invalid request, and the cause for the logs.
type Error struct {
	Code    string
	Message string
	Fields  []FieldError
	Err     error // the cause, never shown to the client
}

// FieldError names one invalid field of a request, e.g. {"items[1].quantity", "must be at
// least 1"}.
type FieldError struct {
	Field   string
	Message string
}

func (e *Error) Error() string {
	msg := e.Code + ": " + e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with code and message whose cause is err.
func Wrap(code string, err error, message string) *Error {
	return &Error{Code: code, Message: message, Err: err}
}

// ErrorCode returns the code of the *Error in err's chain, EINTERNAL for any other error, and
// "" for nil.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the client-safe message of the *Error in err's chain, or a generic one.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "Internal error."
}

// ErrorFields returns the field errors of the *Error in err's chain.
func ErrorFields(err error) []FieldError {
	var e *Error
	if errors.As(err, &e) {
		return e.Fields
	}
	return nil
}

// FromInput returns err as an *Error when it is a refusal of the input policy
// (internal/input), under this service's codes: Malformed is EMALFORMED, Invalid EINVALID
// (with its field errors), TooLarge ETOOLARGE, UnsupportedMediaType EUNSUPPORTED, BadHeader
// EBADHEADER. Other errors are returned as they are.
func FromInput(err error) error {
	var in *input.Error
	if !errors.As(err, &in) {
		return err
	}
	code := EMALFORMED
	switch in.Kind {
	case input.Invalid:
		code = EINVALID
	case input.TooLarge:
		code = ETOOLARGE
	case input.UnsupportedMediaType:
		code = EUNSUPPORTED
	case input.BadHeader:
		code = EBADHEADER
	}
	e := &Error{Code: code, Message: in.Message, Err: err}
	for _, f := range in.Fields {
		e.Fields = append(e.Fields, FieldError(f))
	}
	return e
}

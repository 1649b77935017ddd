// Package apperr is the error both services' domain packages use: a [Code] that classifies
// it, a message fit for the caller, the invalid fields of an input, and the cause for the log.
// Each service aliases the type (orders.Error, warehouse.Error), re-exports the shared codes
// and adds its own (orders.CodeIdempotencyReuse); its http package maps every code to one
// HTTP status in one table (internal/problem Table). Nothing else looks further than the code.
//
// The codes are typed constants, CodeInvalid rather than EINVALID: the compiler then tells a
// code from any other string, and the names follow Go's spelling.
package apperr

import (
	"errors"
	"fmt"

	"github.com/outboxshop/outboxshop/internal/input"
)

// Code classifies an [Error].
type Code string

// The codes both services use. A service adds its own next to them.
const (
	// CodeInvalid: the input is malformed (not JSON, an unknown field, trailing data, a
	// message that breaks the event contract).
	CodeInvalid Code = "invalid"
	// CodeValidation: the input is well-formed but a value is not acceptable; Fields names
	// each.
	CodeValidation Code = "validation"
	// CodeTooLarge: the request body is larger than allowed.
	CodeTooLarge Code = "too_large"
	// CodeUnsupportedMediaType: the request body is not JSON in UTF-8.
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodeBadHeader: a request header breaks the input policy.
	CodeBadHeader Code = "bad_header"
	// CodeNotFound: no such resource.
	CodeNotFound Code = "not_found"
	// CodeConflict: the request clashes with the current state.
	CodeConflict Code = "conflict"
	// CodeUnauthorized: the request lacks valid credentials (internal/bearer: no bearer
	// token, a malformed one, or the wrong one).
	CodeUnauthorized Code = "unauthorized"
	// CodeForbidden: the request is refused whoever sends it (internal/bearer: the routes
	// are disabled because no token is configured).
	CodeForbidden Code = "forbidden"
	// CodeUnavailable: a dependency (the database) cannot be reached; try again later.
	CodeUnavailable Code = "unavailable"
	// CodeInternal: a bug or an unexpected failure.
	CodeInternal Code = "internal"
)

// InternalMessage is the caller-facing message of an error that is not an *Error: its
// details are for the log only.
const InternalMessage = "Internal error."

// FieldError names one invalid field of an input, e.g. {"items[1].quantity", "must be at
// least 1"}.
type FieldError struct {
	Field   string
	Message string
}

// Error is a domain error: a code, a message fit for the caller, the invalid fields when
// there are any, and the cause.
type Error struct {
	Code    Code
	Message string
	Fields  []FieldError
	// Err is the cause, when there is one; it is never shown to callers.
	Err error
}

// Error implements error: "code: message: cause".
func (e *Error) Error() string {
	msg := string(e.Code) + ": " + e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with code and message whose cause is err.
func Wrap(code Code, err error, message string) *Error {
	return &Error{Code: code, Message: message, Err: err}
}

// ErrorCode returns the code of the first *Error in err's chain, CodeInternal when there is
// none, and "" for a nil err.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the caller-facing message of the first *Error in err's chain, or
// [InternalMessage].
func ErrorMessage(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Message
	}
	return InternalMessage
}

// ErrorFields returns the field errors of the first *Error in err's chain.
func ErrorFields(err error) []FieldError {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Fields
	}
	return nil
}

// FromInput returns err as an *Error when it is a refusal of the input policy
// (internal/input): Malformed is CodeInvalid, Invalid CodeValidation (with its field
// errors), TooLarge CodeTooLarge, UnsupportedMediaType CodeUnsupportedMediaType, BadHeader
// CodeBadHeader. Other errors are returned as they are.
func FromInput(err error) error {
	in, ok := errors.AsType[*input.Error](err)
	if !ok {
		return err
	}
	code := CodeInvalid
	switch in.Kind {
	case input.Invalid:
		code = CodeValidation
	case input.TooLarge:
		code = CodeTooLarge
	case input.UnsupportedMediaType:
		code = CodeUnsupportedMediaType
	case input.BadHeader:
		code = CodeBadHeader
	}
	e := &Error{Code: code, Message: in.Message, Err: err}
	for _, f := range in.Fields {
		e.Fields = append(e.Fields, FieldError(f))
	}
	return e
}

package warehouse

import (
	"errors"
	"fmt"

	"github.com/outboxshop/outboxshop/internal/input"
)

// Code classifies an [Error]. The http package maps each code to one HTTP status, in one
// function; the amqp package dead-letters CodeInvalid messages.
type Code string

// Error codes.
const (
	// CodeInvalid: the input is malformed (not JSON, unknown field, trailing data, a message
	// that breaks the event contract).
	CodeInvalid Code = "invalid"
	// CodeValidation: the input is well-formed but a value is not acceptable (out of range).
	CodeValidation Code = "validation"
	// CodeNotFound: no such SKU or reservation.
	CodeNotFound Code = "not_found"
	// CodeConflict: the request clashes with the current state (seeding while stock is
	// reserved).
	CodeConflict Code = "conflict"
	// CodeTooLarge: the request body is larger than allowed.
	CodeTooLarge Code = "too_large"
	// CodeUnsupportedMediaType: the request body is not JSON in UTF-8.
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodeBadHeader: a request header breaks the input policy (a malformed If-Match, say).
	CodeBadHeader Code = "bad_header"
	// CodeBadQuery: a query parameter is not acceptable (a limit out of range, a cursor that
	// is not one of ours).
	CodeBadQuery Code = "bad_query"
	// CodePreconditionFailed: the SKU changed since the caller read it (If-Match), or exists
	// already (If-None-Match: *).
	CodePreconditionFailed Code = "precondition_failed"
	// CodePreconditionRequired: a write that needs If-Match (or If-None-Match: *) came
	// without.
	CodePreconditionRequired Code = "precondition_required"
	// CodeUnavailable: a dependency (the database) cannot be reached; try again later.
	CodeUnavailable Code = "unavailable"
	// CodeInternal: a bug or an unexpected failure.
	CodeInternal Code = "internal"
)

// FieldError names one invalid field of an input.
type FieldError struct {
	Field   string
	Message string
}

// Error is the warehouse's domain error: a code, a message fit for the caller, and the
// invalid fields when there are any. Errors without a code (from the database, say) are
// CodeInternal; see [ErrorCode].
type Error struct {
	Code    Code
	Message string
	Fields  []FieldError
	// Err is the cause, when there is one; it is not shown to callers.
	Err error
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("warehouse %s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("warehouse %s: %s", e.Code, e.Message)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

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

// ErrorMessage returns the caller-facing message of the first *Error in err's chain, or a
// generic text for other errors, whose details are for the log only.
func ErrorMessage(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Message
	}
	return "An internal error occurred."
}

// ErrorFields returns the field errors of the first *Error in err's chain.
func ErrorFields(err error) []FieldError {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Fields
	}
	return nil
}

// FromInput returns err as an *Error when it is a refusal of the input policy
// (internal/input), under this service's codes: Malformed is CodeInvalid, Invalid
// CodeValidation (with its field errors), TooLarge CodeTooLarge, UnsupportedMediaType
// CodeUnsupportedMediaType, BadHeader CodeBadHeader. Other errors are returned as they are.
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

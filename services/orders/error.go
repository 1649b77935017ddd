package orders

import "github.com/outboxshop/outboxshop/internal/apperr"

// Code classifies an [Error] (internal/apperr: the error both services share). The http
// package maps each code to one HTTP status in one table; everything else only looks at the
// code.
type Code = apperr.Code

// Error codes: the shared ones (internal/apperr) and the orders service's own.
const (
	CodeValidation           = apperr.CodeValidation           // the request breaks a rule (field errors in Fields)
	CodeInvalid              = apperr.CodeInvalid              // the request body is not the JSON we accept
	CodeTooLarge             = apperr.CodeTooLarge             // the request body is over the limit
	CodeUnsupportedMediaType = apperr.CodeUnsupportedMediaType // the request body is not application/json
	CodeBadHeader            = apperr.CodeBadHeader            // a request header is invalid
	CodeNotFound             = apperr.CodeNotFound             // no such order
	CodeConflict             = apperr.CodeConflict             // the order's status does not allow the action
	CodeUnavailable          = apperr.CodeUnavailable          // the database cannot be reached; try again later
	CodeInternal             = apperr.CodeInternal             // a bug, or an error nobody expected

	// CodeIdempotencyReuse: an Idempotency-Key was reused with another body.
	CodeIdempotencyReuse Code = "idempotency_reuse"
)

// Error is the service's error: a code, a message safe to show to the client, the field
// errors of an invalid request, and the cause for the logs (internal/apperr).
type Error = apperr.Error

// FieldError names one invalid field of a request, e.g. {"items[1].quantity", "must be at
// least 1"}.
type FieldError = apperr.FieldError

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return apperr.Errorf(code, format, args...)
}

// Wrap returns an *Error with code and message whose cause is err.
func Wrap(code Code, err error, message string) *Error { return apperr.Wrap(code, err, message) }

// ErrorCode returns the code of the *Error in err's chain, CodeInternal for any other error,
// and "" for nil.
func ErrorCode(err error) Code { return apperr.ErrorCode(err) }

// ErrorMessage returns the client-safe message of the *Error in err's chain, or a generic one.
func ErrorMessage(err error) string { return apperr.ErrorMessage(err) }

// ErrorFields returns the field errors of the *Error in err's chain.
func ErrorFields(err error) []FieldError { return apperr.ErrorFields(err) }

// FromInput returns err as an *Error when it is a refusal of the input policy
// (internal/input; see apperr.FromInput for the codes). Other errors are returned as they are.
func FromInput(err error) error { return apperr.FromInput(err) }

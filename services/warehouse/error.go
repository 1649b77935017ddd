package warehouse

import "github.com/outboxshop/outboxshop/internal/apperr"

// Code classifies an [Error] (internal/apperr: the error both services share). The http
// package maps each code to one HTTP status, in one table; the amqp package dead-letters
// CodeInvalid messages.
type Code = apperr.Code

// Error codes: the shared ones (internal/apperr) and the warehouse's own.
const (
	// CodeInvalid: the input is malformed (not JSON, unknown field, trailing data, a message
	// that breaks the event contract).
	CodeInvalid = apperr.CodeInvalid
	// CodeValidation: the input is well-formed but a value is not acceptable (out of range).
	CodeValidation = apperr.CodeValidation
	// CodeNotFound: no such SKU or reservation.
	CodeNotFound = apperr.CodeNotFound
	// CodeConflict: the request clashes with the current state (seeding while stock is
	// reserved).
	CodeConflict = apperr.CodeConflict
	// CodeUnauthorized: an admin route (PUT /stock/{sku}) without the admin token, or with
	// another one.
	CodeUnauthorized = apperr.CodeUnauthorized
	// CodeForbidden: an admin route while no admin token is configured (the admin API is
	// disabled).
	CodeForbidden = apperr.CodeForbidden
	// CodeTooLarge: the request body is larger than allowed.
	CodeTooLarge = apperr.CodeTooLarge
	// CodeUnsupportedMediaType: the request body is not JSON in UTF-8.
	CodeUnsupportedMediaType = apperr.CodeUnsupportedMediaType
	// CodeBadHeader: a request header breaks the input policy (a malformed If-Match, say).
	CodeBadHeader = apperr.CodeBadHeader
	// CodeUnavailable: a dependency (the database) cannot be reached; try again later.
	CodeUnavailable = apperr.CodeUnavailable
	// CodeInternal: a bug or an unexpected failure.
	CodeInternal = apperr.CodeInternal

	// CodeBadQuery: a query parameter is not acceptable (a limit out of range, a cursor that
	// is not one of ours).
	CodeBadQuery Code = "bad_query"
	// CodePreconditionFailed: the SKU changed since the caller read it (If-Match), or exists
	// already (If-None-Match: *).
	CodePreconditionFailed Code = "precondition_failed"
	// CodePreconditionRequired: a write that needs If-Match (or If-None-Match: *) came
	// without.
	CodePreconditionRequired Code = "precondition_required"
)

// Error is the warehouse's domain error: a code, a message fit for the caller, the invalid
// fields when there are any, and the cause (internal/apperr). Errors without a code (from
// the database, say) are CodeInternal; see [ErrorCode].
type Error = apperr.Error

// FieldError names one invalid field of an input.
type FieldError = apperr.FieldError

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return apperr.Errorf(code, format, args...)
}

// ErrorCode returns the code of the first *Error in err's chain, CodeInternal when there is
// none, and "" for a nil err.
func ErrorCode(err error) Code { return apperr.ErrorCode(err) }

// ErrorMessage returns the caller-facing message of the first *Error in err's chain, or a
// generic text for other errors, whose details are for the log only.
func ErrorMessage(err error) string { return apperr.ErrorMessage(err) }

// ErrorFields returns the field errors of the first *Error in err's chain.
func ErrorFields(err error) []FieldError { return apperr.ErrorFields(err) }

// FromInput returns err as an *Error when it is a refusal of the input policy
// (internal/input; see apperr.FromInput for the codes). Other errors are returned as they are.
func FromInput(err error) error { return apperr.FromInput(err) }

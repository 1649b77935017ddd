// Package input is the services' one input policy: what a request body, an identifier, a
// header token or a resource id must look like before anything reaches the database. Both
// services apply it at their HTTP edge (through internal/httpapi) and to the events they
// consume, so that they accept and refuse the same things, with the same words.
//
// # The policy
//
//   - A JSON body is UTF-8 (invalid bytes are refused, never replaced by U+FFFD), holds
//     exactly one JSON object, has no duplicate member names and no lone UTF-16 surrogate
//     escapes ("\ud800"), and names only the fields of the type it is decoded into, spelled
//     exactly (encoding/json would match "CUSTOMER_ID" to customer_id). See [DecodeJSON].
//   - A value of the wrong JSON type, or a number that is not an integer where one is
//     expected, is a field error naming the field ("items[1].quantity"), not a 500.
//   - An identifier (a customer id, a SKU, a product name) has no NUL, no C0 or C1 control
//     character, no DEL and no bidirectional formatting character. See [IdentifierProblem].
//   - A header token (Idempotency-Key, X-Request-ID) is 1 to n bytes of visible ASCII. See
//     [VisibleASCII].
//   - A resource id (an order id) is a UUID in its canonical form: 36 characters, lowercase
//     hexadecimal, hyphenated. See [ParseID].
//
// Every refusal is an [*Error] whose [Kind] the HTTP layer maps to one 4xx status.
package input

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Kind classifies a refused input.
type Kind int

// The kinds of refusal, with the HTTP status each is answered with.
const (
	// Malformed: the body is not the JSON accepted (syntax, encoding, duplicate or unknown
	// member, not an object, data after it). 400.
	Malformed Kind = iota + 1
	// Invalid: the body is well-formed but fields have values that are not acceptable;
	// Fields names them. 422.
	Invalid
	// TooLarge: the body is over the limit. 413.
	TooLarge
	// UnsupportedMediaType: the body is not application/json in UTF-8. 415.
	UnsupportedMediaType
	// BadHeader: a request header breaks the policy. 400.
	BadHeader
)

func (k Kind) String() string {
	switch k {
	case Malformed:
		return "malformed"
	case Invalid:
		return "invalid"
	case TooLarge:
		return "too_large"
	case UnsupportedMediaType:
		return "unsupported_media_type"
	case BadHeader:
		return "bad_header"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// FieldError names one field whose value is not acceptable, e.g. {"items[1].quantity",
// "must be an integer, not a string"}.
type FieldError struct {
	Field   string
	Message string
}

// Error is a refused input. Message is safe to show to the client.
type Error struct {
	Kind    Kind
	Message string
	// Fields are the field errors of an Invalid input.
	Fields []FieldError
	// Err is the cause, when there is one; it is for the logs.
	Err error
}

func (e *Error) Error() string {
	msg := "input " + e.Kind.String() + ": " + e.Message
	for _, f := range e.Fields {
		msg += "; " + f.Field + " " + f.Message
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error of kind with a formatted message.
func Errorf(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// IdentifierProblem returns why s cannot be an identifier, or "" when it can. An identifier
// is valid UTF-8 without NUL, C0 control characters (U+0000–U+001F, so no tab or newline
// either), DEL (U+007F), C1 control characters (U+0080–U+009F) and bidirectional formatting
// characters (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), which let a string show
// something other than what it is. Length and emptiness are the caller's rules.
func IdentifierProblem(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return fmt.Sprintf("must be valid UTF-8 (bad byte at offset %d)", i)
		case r == 0:
			return fmt.Sprintf("must not contain NUL (at offset %d)", i)
		case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("must not contain control characters (U+%04X at offset %d)", r, i)
		case bidi(r):
			return fmt.Sprintf("must not contain bidirectional formatting characters (U+%04X at offset %d)", r, i)
		}
	}
	return ""
}

// bidi reports whether r is a bidirectional formatting character: the Arabic letter mark, the
// left-to-right and right-to-left marks, the embeddings, overrides and their pop, and the
// isolates and their pop.
func bidi(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

// VisibleASCII reports whether s is 1 to maxBytes bytes, each visible ASCII (0x21–0x7E): no
// space, no control character, nothing beyond ASCII.
func VisibleASCII(s string, maxBytes int) bool {
	if s == "" || len(s) > maxBytes {
		return false
	}
	for i := range len(s) {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// ParseID parses a resource id: a UUID in its canonical form, 36 characters of lowercase
// hexadecimal digits hyphenated 8-4-4-4-12, the form the services write. Every other spelling
// that uuid.Parse would accept (uppercase, "urn:uuid:", braces, 32 digits without hyphens)
// is refused, so that a resource has one URL and one spelling in logs and metrics.
func ParseID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.Nil, false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return uuid.Nil, false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return uuid.Nil, false
			}
		}
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

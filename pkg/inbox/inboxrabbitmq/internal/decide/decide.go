// Package decide holds the decisions of the RabbitMQ consumer (package rabbitmq) that package
// rabbitmqtest reports without a broker: which deliveries the consumer dead-letters before a
// transaction ([Refusal]), what a handler's panic is ([PanicError]), and what follows a
// failed attempt ([AfterFailure]). They are pure
// functions, kept here so that the consumer and the test helper share them instead of each
// having its own; the consumer's other decisions are in rabbitmq's decisions.go.
//
// The reasons' texts are on the wire (the dead-reason header) and belong to package rabbitmq:
// a [Reason] is a reason's index in inboxrabbitmq.Reasons(), which lists them in the order the
// consumer checks them.
package decide

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Reason is a dead-letter reason: its index in inboxrabbitmq.Reasons().
type Reason int

// The reasons, in the order of inboxrabbitmq.Reasons(): the order the consumer checks them in.
const (
	NoReason Reason = iota - 1
	MissingMessageID
	InvalidMessageID
	InvalidMessageType
	MessageTooLarge
	UnsupportedContentType
	UnknownType
	MalformedJSON
	Permanent
	MaxDeliveries
	// NumReasons is how many reasons there are.
	NumReasons
)

// Message is what the checks before a transaction look at: a delivery's message-id and type
// properties, its content type and its body.
type Message struct {
	ID, Type, ContentType string
	Body                  []byte
}

// Acceptance is what a consumer accepts, from its configuration: the largest body, the media
// types (lower case, without parameters: see [MediaTypes]; empty accepts any) and the message
// types (empty accepts any).
type Acceptance struct {
	MaxMessageBytes int
	ContentTypes    []string
	Types           []string
}

// Refusal returns why a consumer that accepts a dead-letters m before its handler runs, with
// details, or NoReason. The checks run in the order of the reasons; the body is parsed only
// when it is small enough.
func Refusal(m Message, a Acceptance) (r Reason, detail string) {
	if m.ID == "" {
		return MissingMessageID, "the message has no message-id property, so the inbox cannot deduplicate it"
	}
	if err := (inbox.Message{ID: m.ID, Type: m.Type}).Validate(); err != nil {
		return InvalidMessage(err), err.Error()
	}
	if len(m.Body) > a.MaxMessageBytes {
		return MessageTooLarge, fmt.Sprintf("the body has %d bytes, more than the %d accepted", len(m.Body), a.MaxMessageBytes)
	}
	mt := mediaType(m.ContentType)
	if len(a.ContentTypes) > 0 && !slices.Contains(a.ContentTypes, mt) {
		return UnsupportedContentType, fmt.Sprintf("content type %q is not one of %q", m.ContentType, a.ContentTypes)
	}
	jsonBody := isJSON(mt)
	if jsonBody {
		if cs := charset(m.ContentType); cs != "" && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			return UnsupportedContentType, fmt.Sprintf("content type %q: JSON must be UTF-8", m.ContentType)
		}
	}
	if len(a.Types) > 0 && !slices.Contains(a.Types, m.Type) {
		return UnknownType, fmt.Sprintf("type %q is not one of %q", m.Type, a.Types)
	}
	if jsonBody {
		if err := checkJSON(m.Body); err != nil {
			return MalformedJSON, err.Error()
		}
	}
	return NoReason, ""
}

// InvalidMessage is the reason for a message that inbox.Message.Validate refused with err.
func InvalidMessage(err error) Reason {
	switch {
	case errors.Is(err, inbox.ErrNoMessageID):
		return MissingMessageID
	case errors.Is(err, inbox.ErrInvalidMessageType):
		return InvalidMessageType
	default:
		return InvalidMessageID
	}
}

// Step is what follows a failed attempt of the inbox transaction.
type Step int

const (
	// Interrupted: the consumer is stopping or lost its connection, and that cut the attempt
	// short; it rolled back. Not the message's fault: it is handed back.
	Interrupted Step = iota + 1
	// Hold: a transient failure. The delivery is held and the attempt repeated in place,
	// uncounted.
	Hold
	// DeadLetter: no retry can help, or this was the last of MaxDeliveries attempts.
	DeadLetter
	// Retry: a failure that counts. A retry copy goes back to the queue after a backoff.
	Retry
)

// AfterFailure decides what follows a failed attempt, and for DeadLetter the reason.
// interrupted tells whether the attempt's context ended (a stop, or the connection lost); it
// is checked first, since such an attempt's error says nothing about the message
// (inbox.Classify calls a cancellation ClassFailed). class is inbox.Classify of the attempt's
// error, deliveryCount the attempt's number, from 1.
func AfterFailure(interrupted bool, class inbox.Class, deliveryCount, maxDeliveries int) (Step, Reason) {
	switch {
	case interrupted:
		return Interrupted, NoReason
	case class == inbox.ClassTransient:
		return Hold, NoReason
	case class == inbox.ClassPermanent:
		return DeadLetter, Permanent
	case deliveryCount >= maxDeliveries:
		return DeadLetter, MaxDeliveries
	default:
		return Retry, NoReason
	}
}

// PanicError is the error of a handler that panicked with r: a failed attempt like any
// other, so that a bug in one message's handling neither kills the process nor skips the
// retry and dead-letter path.
func PanicError(r any) error {
	if e, ok := r.(error); ok {
		return fmt.Errorf("handler panicked: %w", e)
	}
	return fmt.Errorf("handler panicked: %v", r)
}

// MediaTypes returns the media types of contentTypes, as [Acceptance] takes them, in a new
// slice (empty, not nil, for none).
func MediaTypes(contentTypes []string) []string {
	mts := make([]string, 0, len(contentTypes))
	for _, ct := range contentTypes {
		mts = append(mts, mediaType(ct))
	}
	return mts
}

// isJSON reports whether a body of this content type must be JSON: application/json, any
// +json type, or no content type at all.
func isJSON(contentType string) bool {
	mt := mediaType(contentType)
	return mt == "" || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// mediaType returns the media type of a content type, lower case and without parameters;
// "" for an empty one.
func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt
}

// charset returns the charset parameter of a content type, or "".
func charset(contentType string) string {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return ""
	}
	return params["charset"]
}

// checkJSON returns why body is not valid JSON, or nil. JSON exchanged between systems is
// UTF-8 (RFC 8259): encoding/json would silently turn invalid bytes inside strings into
// U+FFFD, so they are refused here.
func checkJSON(body []byte) error {
	if json.Valid(body) {
		if !utf8.Valid(body) {
			return errors.New("body is not valid UTF-8")
		}
		return nil
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	if err == nil {
		err = errors.New("invalid JSON")
	}
	return fmt.Errorf("body is not valid JSON: %w", err)
}

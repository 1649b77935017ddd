package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Well-known header names. Add stores every header; the RabbitMQ publisher also copies
// HeaderCorrelationID into the AMQP correlation-id property.
const (
	HeaderCorrelationID = "correlation_id"
	HeaderCausationID   = "causation_id"
	HeaderTraceparent   = "traceparent"
)

// Header names a message may not set itself (see [Message.Validate]). The publisher sets the
// first two from the message's aggregate; RabbitMQ reads the last two as lists of extra
// routing keys, which a string value cannot be.
const (
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	headerCC            = "CC"
	headerBCC           = "BCC"
)

// Limits enforced by [Message.Validate].
const (
	// MaxShortString is the longest Exchange, RoutingKey, Type, header name and
	// correlation id, in bytes: AMQP 0-9-1 carries them as short strings of at most 255
	// bytes, and amqp091-go closes the whole connection on a longer one.
	MaxShortString = 255
	// MaxHeaderBytes bounds the headers as they travel: the AMQP field table of the
	// message's Headers plus the aggregate_type and aggregate_id headers the publisher adds,
	// encoded (see [Message.HeaderBytes]). The table rides in the message's content header,
	// which must fit in one frame; RabbitMQ closes the connection (501 frame_too_large) when
	// it does not. 64 KiB is half of RabbitMQ's default frame_max of 131072 bytes, leaving
	// room for the other properties; a broker configured with a smaller frame_max is checked
	// by the publisher against the size it negotiated.
	MaxHeaderBytes = 64 << 10
)

// Message is one event in the outbox.
//
// The fields up to Headers are written by [Add]. CreatedAt and Attempts are read back by the
// relay for the [Publisher] and the [Hooks]; Add ignores them.
type Message struct {
	// ID identifies the message for ever: the relay publishes it as the broker message id and
	// consumers deduplicate on it. Add fills in a time-ordered UUIDv7 when it is zero.
	ID uuid.UUID
	// Exchange and RoutingKey are the destination.
	Exchange   string
	RoutingKey string
	// Type names the event, e.g. "OrderCreated".
	Type string
	// AggregateType and AggregateID are the ordering key: the messages of one aggregate are
	// published in the order they were added.
	AggregateType string
	AggregateID   string
	// Payload is the event body, JSON.
	Payload json.RawMessage
	// Headers travel with the message (HeaderCorrelationID, HeaderCausationID,
	// HeaderTraceparent, …). [Add] stores them with the trace context of its ctx added
	// (HeaderTraceparent, HeaderTracestate, HeaderBaggage) unless they set it; the relay
	// publishes them with its publish span's context in place of the stored one.
	Headers map[string]string

	// CreatedAt is when the row was inserted (the start of the writing transaction).
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts of this row.
	Attempts int
}

// Validate reports whether m can be stored and published, and if not, which field is wrong
// and why, in an error wrapping [ErrInvalidMessage]. [Add] calls it for every message before
// writing any. The RabbitMQ publisher checks every row it is given with it again (rows
// written by hand or by older code), but for the payload's JSON syntax and the two
// aggregate headers (see its Publish documentation): a message that fails is never sent,
// and its row is marked dead with the reason.
//
// The rules are what PostgreSQL cannot store and what the broker would refuse, by closing the
// channel or the whole connection, which would otherwise look like a broker outage:
//
//   - Type, AggregateType and AggregateID are not empty, and Exchange or RoutingKey is set.
//   - Every text field (Exchange, RoutingKey, Type, AggregateType, AggregateID, header names
//     and values) is valid UTF-8 without NUL bytes: PostgreSQL's text and jsonb cannot hold
//     NUL, and encoding invalid UTF-8 as JSON would silently replace it.
//   - Exchange, RoutingKey, Type, each header name and the correlation_id header's value are
//     at most [MaxShortString] bytes (AMQP short strings).
//   - No header is named aggregate_type or aggregate_id (the publisher sets them from the
//     aggregate), nor CC or BCC (RabbitMQ reads those as arrays of routing keys and closes
//     the channel for a string: 406 "unacceptable_type_in_header").
//   - The encoded headers ([Message.HeaderBytes]) are at most [MaxHeaderBytes].
//   - Payload is valid JSON and valid UTF-8 (encoding/json alone accepts invalid UTF-8
//     inside strings). The JSON escape \u0000 is valid JSON and is allowed.
//
// The payload's size is not checked here: [Config].MaxMessageBytes is the relay's limit.
func (m Message) Validate() error {
	invalid := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidMessage, field, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Type == "":
		return invalid("Type", "is empty")
	case m.AggregateType == "":
		return invalid("AggregateType", "is empty")
	case m.AggregateID == "":
		return invalid("AggregateID", "is empty")
	case m.Exchange == "" && m.RoutingKey == "":
		return invalid("Exchange and RoutingKey", "are both empty: no destination")
	}
	for _, f := range [...]struct {
		name, value string
		short       bool
	}{
		{"Exchange", m.Exchange, true},
		{"RoutingKey", m.RoutingKey, true},
		{"Type", m.Type, true},
		{"AggregateType", m.AggregateType, false},
		{"AggregateID", m.AggregateID, false},
	} {
		if problem := textProblem(f.value, f.short); problem != "" {
			return invalid(f.name, "%s", problem)
		}
	}
	for k, v := range m.Headers {
		if problem := textProblem(k, true); problem != "" {
			return invalid("header name "+quoteShort(k), "%s", problem)
		}
		switch k {
		case HeaderAggregateType, HeaderAggregateID:
			return invalid("header name "+quoteShort(k), "is reserved: the publisher sets it from the message's aggregate")
		case headerCC, headerBCC:
			return invalid("header name "+quoteShort(k), "is reserved: RabbitMQ reads it as an array of routing keys and refuses a string")
		}
		if problem := textProblem(v, k == HeaderCorrelationID); problem != "" {
			return invalid("header "+quoteShort(k), "%s", problem)
		}
	}
	if n := m.HeaderBytes(); n > MaxHeaderBytes {
		return invalid("Headers", "take %d bytes encoded (with aggregate_type and aggregate_id), over the limit of %d", n, MaxHeaderBytes)
	}
	switch {
	case len(m.Payload) == 0:
		return invalid("Payload", "is empty")
	case !json.Valid(m.Payload):
		return invalid("Payload", "is not valid JSON")
	case !utf8.Valid(m.Payload):
		return invalid("Payload", "is not valid UTF-8")
	}
	return nil
}

// HeaderBytes returns the size of the AMQP field table that carries m's headers to the
// broker: its Headers plus aggregate_type and aggregate_id, each entry encoded as a short
// string name, a type byte and a long string value, after the table's 4-byte length.
func (m Message) HeaderBytes() int {
	entry := func(k, v string) int { return 1 + len(k) + 1 + 4 + len(v) }
	n := 4 + entry(HeaderAggregateType, m.AggregateType) + entry(HeaderAggregateID, m.AggregateID)
	for k, v := range m.Headers {
		if k == HeaderAggregateType || k == HeaderAggregateID {
			continue // replaced by the publisher's own
		}
		n += entry(k, v)
	}
	return n
}

// textProblem describes what is wrong with a text field, or returns "".
func textProblem(s string, short bool) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which PostgreSQL cannot store"
	case short && len(s) > MaxShortString:
		return fmt.Sprintf("is %d bytes, over the AMQP short-string limit of %d", len(s), MaxShortString)
	}
	return ""
}

// quoteShort quotes s for an error message, cut to a readable length.
func quoteShort(s string) string {
	const max = 40
	if len(s) > max {
		return fmt.Sprintf("%q… (%d bytes)", s[:max], len(s))
	}
	return fmt.Sprintf("%q", s)
}

package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Well-known header names. The RabbitMQ publisher copies HeaderCorrelationID into the AMQP
// correlation-id property; [Add] records the trace context as the last three (W3C trace
// context and baggage).
const (
	HeaderCorrelationID = "correlation_id"
	HeaderCausationID   = "causation_id"
	HeaderTraceparent   = "traceparent"
	HeaderTracestate    = "tracestate"
	HeaderBaggage       = "baggage"
)

// Header names a message may not set itself: the publisher sets them from the message's
// aggregate ([Message.Validate]).
const (
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	headerCC            = "CC"
	headerBCC           = "BCC"
)

// Limits enforced by [Message.Validate].
const (
	// MaxShortString is the longest Exchange, RoutingKey, Type, header name and correlation
	// id, in bytes: AMQP carries them as short strings.
	MaxShortString = 255
	// MaxHeaderBytes bounds the encoded headers ([Message.HeaderBytes]), which must fit in
	// one AMQP frame: half of RabbitMQ's default frame_max, 128 KiB.
	MaxHeaderBytes = 64 << 10
)

// Message is one event in the outbox. [Add] writes the fields up to Headers; the relay reads
// CreatedAt and Attempts back for the [Publisher] and the [Hooks].
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
	// Headers travel with the message (HeaderCorrelationID, …); [Add] adds the trace
	// context of its ctx unless they set it, and the relay sends its publish span's.
	Headers map[string]string

	// CreatedAt is when the row was inserted (the start of the writing transaction).
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts of this row.
	Attempts int
}

// Validate reports whether m can be stored and published, and if not, which field is wrong
// and why, in an error wrapping [ErrInvalidMessage]. It refuses what PostgreSQL cannot store
// and what the broker would refuse by closing the channel or the connection
// (README.md#what-add-accepts says why): an empty Type, AggregateType or AggregateID, or no
// Exchange nor RoutingKey; text that is not valid UTF-8 or holds a NUL byte; Exchange,
// RoutingKey, Type, a header name or the correlation_id header over [MaxShortString] bytes;
// a header named aggregate_type, aggregate_id, CC or BCC; headers over [MaxHeaderBytes]
// encoded; a Payload that is not valid JSON in valid UTF-8 (the \u0000 escape is fine). The
// payload's size is [Config].MaxMessageBytes's business.
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

// HeaderBytes returns the size of the AMQP field table that carries m's headers, with the
// aggregate_type and aggregate_id headers the publisher adds.
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

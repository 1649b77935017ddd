package outboxrabbitmq

import (
	"encoding/json"
	"fmt"
	"maps"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// This file holds what a message becomes on the wire, and the limits that keep a message the
// broker would refuse, by closing the channel or the connection, from being sent: pure
// functions of the message and the limits.

const contentType = "application/json"

var emptyObject = json.RawMessage(`{}`)

// publishing is the AMQP message for m: see [Publisher.Publish] for its properties.
func publishing(m outbox.Message) amqp.Publishing {
	headers := make(amqp.Table, len(m.Headers)+2)
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[outbox.HeaderAggregateType] = m.AggregateType
	headers[outbox.HeaderAggregateID] = m.AggregateID
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   contentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.Headers[outbox.HeaderCorrelationID],
		MessageId:     m.ID.String(),
		Timestamp:     m.CreatedAt,
		Type:          m.Type,
		Body:          m.Payload,
	}
}

// validate returns outbox.Permanent with the reason if m can never be published: it fails
// Validate, or its body is over maxMessageBytes (0: no limit).
//
// The body's JSON syntax is not checked here: the broker does not read the body, and
// PostgreSQL's json columns hold valid JSON only, so parsing every payload again would cost
// the relay CPU for nothing (encoding/json validates about as fast as it parses).
func validate(m outbox.Message, maxMessageBytes int) error {
	if len(m.Payload) == 0 {
		return outbox.Permanent(fmt.Errorf("%w: Payload is empty", outbox.ErrInvalidMessage))
	}
	envelope := m
	envelope.Payload = emptyObject
	_, aggType := m.Headers[outbox.HeaderAggregateType]
	_, aggID := m.Headers[outbox.HeaderAggregateID]
	if aggType || aggID {
		// Add refuses these names, but older code stored them, and the publisher always
		// overwrote them with the aggregate's: it still does, rather than bury the row.
		envelope.Headers = maps.Clone(m.Headers)
		delete(envelope.Headers, outbox.HeaderAggregateType)
		delete(envelope.Headers, outbox.HeaderAggregateID)
	}
	if err := envelope.Validate(); err != nil {
		return outbox.Permanent(err)
	}
	if maxMessageBytes > 0 && len(m.Payload) > maxMessageBytes {
		return outbox.Permanent(fmt.Errorf("%w: body of %d bytes is over the broker's max_message_size of %d (Config.MaxMessageBytes)",
			outbox.ErrTooLarge, len(m.Payload), maxMessageBytes))
	}
	return nil
}

// fitting returns the messages of send (indexes into msgs) whose content header fits in a
// frame of frameMax bytes, reusing send's array, and sets errs for the others.
func fitting(msgs []outbox.Message, send []int, frameMax int, errs []error) []int {
	kept := send[:0]
	for _, i := range send {
		if err := fitsFrame(msgs[i], frameMax); err != nil {
			errs[i] = err
			continue
		}
		kept = append(kept, i)
	}
	return kept
}

// fitsFrame returns outbox.Permanent if m's content header would not fit in one frame of
// frameMax bytes (0: no limit). Validate keeps the headers well under RabbitMQ's default
// frame_max; this catches a broker configured with a smaller one.
func fitsFrame(m outbox.Message, frameMax int) error {
	if n := contentHeaderFrameSize(m); frameMax > 0 && n > frameMax {
		return outbox.Permanent(fmt.Errorf("%w: its content header frame would take %d bytes, over the frame_max of %d negotiated with the broker",
			outbox.ErrInvalidMessage, n, frameMax))
	}
	return nil
}

// contentHeaderFrameSize is the size on the wire of the content header frame that carries the
// properties [publishing] gives m, as amqp091-go writes it: the frame's type, channel and size
// (7 bytes) and end byte, then class, weight, body size and property flags, then each
// property present. RabbitMQ closes the connection (501 frame_too_large) when it exceeds the
// negotiated frame_max.
func contentHeaderFrameSize(m outbox.Message) int {
	n := 7 + 1 + 2 + 2 + 8 + 2
	short := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	short(contentType)
	n += m.HeaderBytes() // never empty: aggregate_type and aggregate_id are always there
	n++                  // delivery mode
	short(m.Headers[outbox.HeaderCorrelationID])
	short(m.ID.String())
	if !m.CreatedAt.IsZero() {
		n += 8
	}
	short(m.Type)
	return n
}

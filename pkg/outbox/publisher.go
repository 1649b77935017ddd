package outbox

import (
	"context"
	"errors"
)

// Publisher sends messages to a broker and reports, for each one, whether the broker took
// responsibility for it.
//
// Publish returns one error per message, in order: nil only when the broker confirmed the
// message, never for a confirm that did not come. It blames every failure on one thing, and
// the relay reads the errors so:
//
//   - [ErrUnavailable]: the broker or the connection, not the message (unreachable, not
//     reading or confirming, blocked by a resource alarm). The row is left as it was, and
//     the relay pauses with the outage backoff.
//   - [ErrNotSent]: given up through no fault of the message, the broker not known to be
//     down (another message closed the channel, say). The row is left as it was.
//   - [ErrRefused]: refused by the broker for a reason of its own, not the message's content
//     (a full queue, a queue without quorum). The row is retried later, no attempt counted.
//   - [IsPermanent]: no retry can help. The row is dead at once, err its last_error.
//   - anything else (an unroutable return, wrapping [ErrUnroutable]; a channel closed over
//     this message): the attempt counts, and the row is retried until [Config].MaxAttempts.
//
// Publish returns within the deadline of ctx (plus a moment to clean up), whatever the
// broker does; time spent waiting for another caller of a shared Publisher counts too.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

// ConcurrentPublisher is a [Publisher] that serves several Publish calls at once: a relay
// with [Config].InFlightBatches above 1 sends it each batch as soon as it is claimed, and
// any other Publisher one batch at a time (README.md#batches-in-flight).
type ConcurrentPublisher interface {
	Publisher
	// ConcurrentPublishes is how many Publish calls it serves at once: 1 or more, the same
	// for its whole life. A call beyond that waits for one to end, within its deadline.
	ConcurrentPublishes() int
}

// MessagingSystemNamer is a [Publisher] that names its messaging system ("rabbitmq"), the
// default of [Config].MessagingSystem.
type MessagingSystemNamer interface {
	Publisher
	MessagingSystem() string
}

// The classes of a publish failure: see [Publisher].
var (
	ErrUnavailable = errors.New("outbox: broker unavailable")
	ErrNotSent     = errors.New("outbox: message not sent")
	ErrRefused     = errors.New("outbox: refused by the broker")
	// ErrTooLarge, made Permanent: a payload over Config.MaxMessageBytes or the broker's limit.
	ErrTooLarge = errors.New("outbox: message too large")
	// ErrUnroutable: the broker could deliver the message to no queue (an attempt counts).
	ErrUnroutable = errors.New("outbox: unroutable")
)

// Permanent marks err as one that no retry can fix: the relay marks the row dead at once,
// its last_error "permanent: " and err's text. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was made by [Permanent].
// IsPermanent(nil) is false.
func IsPermanent(err error) bool {
	_, ok := errors.AsType[*permanentError](err)
	return ok
}

// permanentError is the mark of [Permanent]. pkg/inbox marks its errors the same way, so
// that the two libraries read alike:
//   - a pointer, so that errors.Is compares marks by identity: comparing two struct values
//     compares the errors they wrap, which panics when those are of an uncomparable type;
//   - no prefix on the message: a mark classifies an error, it adds no context, so Error
//     is the wrapped error's text; what acts on the class says so where it matters (the
//     relay's last_error, the inbox consumer's dead-letter reason).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

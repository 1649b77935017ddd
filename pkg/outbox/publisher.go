package outbox

import (
	"context"
	"errors"
)

// Publisher sends messages to a broker and reports, for each one, whether the broker took
// responsibility for it. The rabbitmq subpackage has the RabbitMQ implementation.
//
// Publish must return exactly one error per message, in order. nil means the broker confirmed
// the message (for RabbitMQ: a publisher-confirm ack, and no return). A message whose confirm
// never came must not be reported as nil. Every failure is blamed on exactly one thing, the
// broker, the message, or neither, and the relay reads the errors as follows:
//
//   - errors.Is(err, [ErrUnavailable]): the broker or the connection failed, not the message
//     (unreachable, closed the connection, stopped reading or confirming, blocked by a
//     resource alarm). The row is left as it was (no attempt is counted) and the relay pauses
//     with backoff.
//   - errors.Is(err, [ErrNotSent]): the publisher gave up on the message through no fault of
//     the message, with the broker not known to be down (say, another message of the batch
//     closed the channel, or the deadline passed while another caller had the publisher).
//     The row is left as it was and the relay carries on.
//   - errors.Is(err, [ErrRefused]): the broker refused the message for a reason of its own,
//     not because of its content (for RabbitMQ, a nack: a full queue with overflow
//     reject-publish, i.e. its consumers are down; a quorum queue without a quorum; an
//     internal error). No attempt is counted; the relay retries the row after a backoff.
//   - [IsPermanent](err): no retry can help: the message fails [Message.Validate] or the
//     broker refused its content. The row is marked dead at once, with err as last_error.
//   - any other error (an unroutable return, which wraps [ErrUnroutable]; a channel closed by
//     the broker over this message, e.g. its exchange does not exist): the row's attempt
//     counts, and it is retried with backoff until [Config].MaxAttempts.
//
// Publish must return within the deadline of ctx (plus a moment to clean up), whatever the
// broker or the network does. Several relays may share one Publisher; ctx carries each
// caller's publish deadline, and time spent waiting for another caller counts against it.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

// ConcurrentPublisher is a [Publisher] that serves several Publish calls at once (the
// RabbitMQ publisher with more than one connection). A relay with [Config].InFlightBatches
// above 1 then sends each batch as soon as it is claimed, while the confirms of the batches
// before it are still coming, instead of after them: see the package documentation's
// Pipelining section. Any other Publisher is given one batch at a time by each relay.
type ConcurrentPublisher interface {
	Publisher
	// ConcurrentPublishes is how many Publish calls it serves at once: 1 or more, the same
	// for its whole life. A call beyond that waits for one to end, within its deadline.
	ConcurrentPublishes() int
}

var (
	// ErrUnavailable marks a connection-level failure: the broker cannot be reached, or does
	// not take messages now.
	ErrUnavailable = errors.New("broker unavailable")
	// ErrNotSent marks a message the publisher did not send, through no fault of its own.
	ErrNotSent = errors.New("message not sent")
	// ErrRefused marks a message the broker refused for a reason of its own, not because of
	// the message (a full queue that rejects publishes because its consumers are down, a
	// queue without quorum): no attempt is counted, and the relay retries it after a backoff.
	ErrRefused = errors.New("refused by the broker")
	// ErrTooLarge is wrapped (as a permanent error) for a payload over Config.MaxMessageBytes,
	// or over the broker's own limit where the publisher knows it.
	ErrTooLarge = errors.New("message too large")
	// ErrUnroutable marks a message the broker took but could deliver to no queue (for
	// RabbitMQ, a mandatory message returned). The relay reads it like any other error: the
	// attempt counts. It exists so that metrics can tell it apart without knowing the broker.
	ErrUnroutable = errors.New("unroutable")
)

// Permanent marks err as one that no retry can fix. A [Publisher] returns it for a message
// that can never be published; the relay then marks the row dead at once, and its
// last_error reads "permanent: " and err's text. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether the outermost class mark in err's chain is [Permanent]; the
// outbox has no other mark, so: whether err, or an error it wraps, was made by Permanent.
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

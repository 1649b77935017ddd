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
// never came must not be reported as nil. The relay reads the other errors as follows:
//
//   - errors.Is(err, [ErrUnavailable]): the broker or the connection failed, not the message.
//     The row is left as it was (no attempt is counted) and the relay pauses with backoff.
//   - errors.Is(err, [ErrNotSent]): the publisher gave up on the message before the broker saw
//     it, through no fault of the message (say, an earlier message of the batch closed the
//     channel). The row is left as it was and the relay carries on.
//   - [IsPermanent](err): no retry can help (the message cannot be encoded, say). The row is
//     marked dead at once.
//   - any other error (a nack, an unroutable return): the row's attempt counts, and it is
//     retried with backoff until [Config].MaxAttempts.
//
// The relay calls Publish from one goroutine at a time; ctx carries the publish deadline.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

var (
	// ErrUnavailable marks a connection-level failure: the broker cannot be reached.
	ErrUnavailable = errors.New("broker unavailable")
	// ErrNotSent marks a message the publisher did not send, through no fault of its own.
	ErrNotSent = errors.New("message not sent")
	// ErrRefused marks a message the broker refused for a reason of its own, not the
	// message's: a full queue that rejects publishes (its consumers are down), a queue
	// without quorum. The row is retried after a backoff and no attempt is counted.
	ErrRefused = errors.New("refused by the broker")
	// ErrTooLarge is wrapped (as a permanent error) for a payload over Config.MaxMessageBytes.
	ErrTooLarge = errors.New("message too large")
)

type permanentError struct{ err error }

func (e permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that no retry can fix. A [Publisher] returns it for a message
// that can never be published; the relay then marks the row dead at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was made by [Permanent].
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

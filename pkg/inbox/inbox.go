package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TxBeginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it, and so does
// pgx.Tx, whose Begin opens a savepoint: [Process] then runs inside the caller's transaction
// and the caller's commit makes it durable.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Message is what the inbox needs to know about a received message.
type Message struct {
	// ID identifies the message across redeliveries and retries: the producer's message id
	// (for RabbitMQ the message-id property), never a delivery tag. Required.
	ID string
	// Type is the message type, recorded for operators (e.g. "order.placed"). May be empty.
	Type string
	// ReceivedAt is when the consumer received the message; the zero value means now.
	ReceivedAt time.Time
}

// Errors returned by [Process] for input it refuses before touching the database.
var (
	ErrNoConsumer  = errors.New("inbox: consumer name is empty")
	ErrNoMessageID = errors.New("inbox: message id is empty")
)

// SQL run by Process. $1 consumer, $2 message id, $3 message type, $4 received at.
const insertMessageSQL = `INSERT INTO inbox_messages (consumer, message_id, message_type, received_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, message_id) DO NOTHING`

// Process applies a message at most once per consumer and reports whether it was a duplicate.
//
// It begins a transaction on db and records (consumer, msg.ID) in inbox_messages. When the row
// is new, it calls fn with the same transaction and commits, so the inbox row and everything fn
// wrote become visible together. When the row already exists the message was processed
// before: fn is not called, nothing is written, and Process returns duplicate == true with a
// nil error. The caller acknowledges the message to its broker in both cases, and only after
// Process returned a nil error.
//
// When fn returns an error, the whole transaction is rolled back, the inbox row included, so a
// redelivery of the message tries again; the error is returned wrapped (errors.Is, errors.As
// and [IsPermanent] see through the wrapping). A nil fn records the message without doing
// anything else. When the commit itself fails, Process returns that error: the effect may or
// may not have happened, and a redelivery resolves it, because the inbox tells whether the
// commit went through.
//
// An empty consumer or msg.ID returns [ErrNoConsumer] or [ErrNoMessageID] without touching the
// database.
//
// # Concurrent deliveries
//
// Two deliveries of the same message may be processed at the same time (a redelivery racing
// the original, or two replicas of a service). The INSERT … ON CONFLICT DO NOTHING of the
// second transaction finds the first transaction's uncommitted index entry for the same key
// and waits on its row lock. If the first commits, the second sees the conflict, inserts
// nothing and reports a duplicate; if the first rolls back, the second inserts and runs fn.
// Either way fn's effects are committed exactly once. This holds at READ COMMITTED, the
// PostgreSQL default; under REPEATABLE READ or SERIALIZABLE the waiting transaction fails
// with a serialization error instead, which Process returns, and a redelivery then finds the
// row and reports a duplicate.
func Process(ctx context.Context, db TxBeginner, consumer string, msg Message, fn func(ctx context.Context, tx pgx.Tx) error) (duplicate bool, err error) {
	if consumer == "" {
		return false, ErrNoConsumer
	}
	if msg.ID == "" {
		return false, ErrNoMessageID
	}
	receivedAt := msg.ReceivedAt
	if receivedAt.IsZero() {
		receivedAt = time.Now()
	}

	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: begin transaction for message %q: %w", msg.ID, err)
	}
	// Rolling back after a successful commit is a no-op. A cancelled ctx must not prevent the
	// rollback, or the connection would go back to a pool inside a failed transaction.
	defer rollback(ctx, tx)

	tag, err := tx.Exec(ctx, insertMessageSQL, consumer, msg.ID, msg.Type, receivedAt)
	if err != nil {
		return false, fmt.Errorf("inbox: record message %q: %w", msg.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return true, nil // processed before; the deferred rollback ends the empty transaction
	}
	if fn != nil {
		if err := fn(ctx, tx); err != nil {
			return false, fmt.Errorf("inbox: handle message %q: %w", msg.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox: commit message %q: %w", msg.ID, err)
	}
	return false, nil
}

// rollback ends tx, also when ctx is already cancelled, within a few seconds.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // pgx closes the connection itself when the rollback fails
}

// Permanent marks err as permanent: retrying the message cannot help (it is invalid, refers to
// something that does not exist, breaks a business rule). A consumer runner such as the
// rabbitmq subpackage dead-letters a message whose handler returned a permanent error at
// once, instead of retrying it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

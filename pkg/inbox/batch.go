package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxBatch is the most messages [ProcessBatch] takes in one transaction. Each message runs
// under its own savepoint, a subtransaction; past 64 of them in one transaction a
// PostgreSQL backend's cache of subtransaction ids overflows, and every other session's
// snapshots then read pg_subtrans.
const MaxBatch = 64

// Result is what [ProcessBatch] did with one message.
type Result struct {
	// Duplicate is true when the message was processed before: fn was not called.
	Duplicate bool
	// Err is the message's own failure: nothing it wrote is committed, and the other
	// messages' effects are. It is marked for [Classify] as [Process] marks its errors: a
	// message that fails [Message.Validate] or whose inbox row PostgreSQL refused is
	// [Permanent]; another failed insert is [Transient]; fn's error is returned wrapped,
	// for Classify to judge.
	Err error
}

// ProcessBatch is [Process] for several messages in one transaction, one commit for all.
// It records messages in the table of the default [Tables]; [Store.ProcessBatch] in another.
func ProcessBatch(ctx context.Context, db TxBeginner, consumer string, msgs []Message,
	fn func(ctx context.Context, tx pgx.Tx, i int) error,
) ([]Result, error) {
	return defaultStore.ProcessBatch(ctx, db, consumer, msgs, fn)
}

// ProcessBatch applies each of msgs at most once per consumer, in one transaction, and
// returns one [Result] per message, in order.
//
// It begins a transaction on db and, for each message in turn, sets a savepoint, records
// (consumer, msg.ID) in the inbox table and, when the row is new, calls fn with the
// transaction and the message's index. When fn returns an error (or the insert fails), the
// transaction rolls back to the message's savepoint, undoing its inbox row and all it wrote,
// the message's Result carries the error, and the next message goes on. A message whose ID
// comes twice in msgs is processed once: the second is a duplicate of the first, unless the
// first failed. Then ProcessBatch commits with [CommitReplicated], and the Results hold:
// acknowledge every message whose Err is nil, and only then.
//
// A non-nil error means the transaction as a whole failed: beginning it, a savepoint, a
// rollback to one, or the commit. Then the Results are nil and no message may be
// acknowledged. Nothing is committed, except after a failed commit, whose outcome is unknown
// as with [Process]: a redelivery finds out through the inbox. A failed begin and a commit of
// unknown outcome are marked [Transient]; anything else is returned for [Classify] to judge:
// a lost connection is transient, a deferred constraint that fails at commit is not, and
// then processing the messages one by one with Process finds the message at fault.
//
// fn runs on the batch's ctx; to give each message its own context (its span), derive it
// inside fn. It must not commit or roll back tx, nor leave it in a failed state: a statement
// error it recovers from itself must be inside a savepoint of its own (tx.Begin). Messages
// see what the messages before them in the batch wrote. ProcessBatch makes no span and marks
// none: a runner marks its messages' spans from the Results. At most [MaxBatch] messages;
// an empty batch does nothing.
func (s *Store) ProcessBatch(ctx context.Context, db TxBeginner, consumer string, msgs []Message,
	fn func(ctx context.Context, tx pgx.Tx, i int) error,
) ([]Result, error) {
	if err := ValidateConsumer(consumer); err != nil {
		return nil, err
	}
	if len(msgs) > MaxBatch {
		return nil, fmt.Errorf("inbox: a batch of %d messages, more than MaxBatch (%d)", len(msgs), MaxBatch)
	}
	if len(msgs) == 0 {
		return []Result{}, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, Transient(fmt.Errorf("begin transaction for a batch of %d messages: %w", len(msgs), err))
	}
	// Rolling back after a successful commit is a no-op; see Process.
	defer rollback(ctx, tx)

	now := time.Now()
	results := make([]Result, len(msgs))
	for i, msg := range msgs {
		if err := msg.Validate(); err != nil {
			results[i].Err = err
			continue
		}
		if msg.ReceivedAt.IsZero() {
			msg.ReceivedAt = now
		}
		if results[i], err = s.processSaved(ctx, tx, consumer, msg, i, fn); err != nil {
			return nil, err
		}
	}
	if err := CommitReplicated(ctx, tx); err != nil {
		if errors.Is(err, ErrCommitUnknown) {
			err = Transient(err)
		}
		return nil, fmt.Errorf("commit a batch of %d messages: %w", len(msgs), err)
	}
	return results, nil
}

// processSaved processes the i-th message of a batch under its own savepoint. The savepoint
// and the inbox row's insert go to the server together, in one round trip (see
// savepointAndInsert). The savepoint is
// not released: a later message's savepoint nests in it, which costs nothing more, and a
// rollback to it still undoes exactly this message. It returns an error only when tx itself
// failed (the savepoint, or the rollback to it).
func (s *Store) processSaved(ctx context.Context, tx pgx.Tx, consumer string, msg Message, i int,
	fn func(ctx context.Context, tx pgx.Tx, i int) error,
) (Result, error) {
	savepoint := "inbox_batch_" + strconv.Itoa(i)
	tag, spErr, insertErr, closeErr := s.savepointAndInsert(ctx, tx, savepoint, consumer, msg)
	if spErr != nil {
		return Result{}, fmt.Errorf("savepoint for message %q: %w", msg.ID, spErr)
	}
	var failure error
	switch {
	case insertErr != nil || closeErr != nil:
		// Close repeats the insert's error, if any.
		err := fmt.Errorf("record message %q: %w", msg.ID, cmp.Or(insertErr, closeErr))
		if isDataException(err) {
			failure = Permanent(err)
		} else {
			failure = Transient(err)
		}
	case tag.RowsAffected() == 0:
		return Result{Duplicate: true}, nil
	case fn != nil:
		if err := fn(ctx, tx, i); err != nil {
			failure = fmt.Errorf("handle message %q: %w", msg.ID, err)
		}
	}
	if failure == nil {
		return Result{}, nil
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return Result{}, fmt.Errorf("roll back message %q (%v): %w", msg.ID, failure, err)
	}
	return Result{Err: failure}, nil
}

// savepointAndInsert sets the savepoint and inserts msg's inbox row, in one round trip. In
// the simple protocol a batch is one query string, which the server converts to its
// encoding before it runs any of it: a value it cannot store would fail the savepoint with
// the insert, and with it the whole batch. There the two go one after the other.
func (s *Store) savepointAndInsert(ctx context.Context, tx pgx.Tx, savepoint, consumer string, msg Message) (
	tag pgconn.CommandTag, spErr, insertErr, closeErr error,
) {
	if tx.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		if _, spErr = tx.Exec(ctx, "SAVEPOINT "+savepoint); spErr != nil {
			return tag, spErr, nil, nil
		}
		tag, insertErr = tx.Exec(ctx, s.sql.insertMessage, consumer, msg.ID, msg.Type, msg.ReceivedAt)
		return tag, nil, insertErr, nil
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + savepoint)
	b.Queue(s.sql.insertMessage, consumer, msg.ID, msg.Type, msg.ReceivedAt)
	br := tx.SendBatch(ctx, b)
	_, spErr = br.Exec()
	tag, insertErr = br.Exec()
	closeErr = br.Close()
	return tag, spErr, insertErr, closeErr
}

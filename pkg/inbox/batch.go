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

// MaxBatch is the most messages [ProcessBatch] takes in one transaction. When a batch runs
// again with a savepoint per message (see ProcessBatch), each savepoint is a
// subtransaction; past 64 of them in one transaction a PostgreSQL backend's cache of
// subtransaction ids overflows, and every other session's snapshots then read pg_subtrans.
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
// It begins a transaction on db, records (consumer, msg.ID) of every message in the inbox
// table in one statement, calls fn with the transaction and the index of each message whose
// row is new, in order, and commits with [CommitReplicated]. When a message fails there (its
// row refused, or fn returned an error), that attempt is rolled back whole and the batch
// runs again in a new transaction, each message under a savepoint of its own: when fn
// returns an error (or the insert fails) this time, the transaction rolls back to the
// message's savepoint, undoing its inbox row and all it wrote, the message's Result carries
// the error, and the next message goes on. So fn may be called twice for a message within
// one call, in two transactions of which at most one commits; everything fn does beside tx
// must bear that, as it must bear a redelivery. A message whose ID comes twice in msgs is
// processed once: the second is a duplicate of the first, unless the first failed. The
// Results hold once ProcessBatch returns a nil error: acknowledge every message whose Err is
// nil, and only then.
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
	now := time.Now()
	valid := make([]Message, len(msgs))
	invalid := make([]error, len(msgs))
	for i, msg := range msgs {
		invalid[i] = msg.Validate()
		if msg.ReceivedAt.IsZero() {
			msg.ReceivedAt = now
		}
		valid[i] = msg
	}
	results, err := s.processTogether(ctx, db, consumer, valid, invalid, fn)
	if !errors.Is(err, errOneFailed) {
		return results, err
	}
	return s.processEachSaved(ctx, db, consumer, valid, invalid, fn)
}

// errOneFailed is what processTogether returns when a message failed: its transaction was
// rolled back, and the batch runs again with a savepoint per message.
var errOneFailed = errors.New("a message of the batch failed")

// insertMessagesSQL records the messages of a batch: $1 consumer, $2 message ids (distinct),
// $3 their types, $4 when each was received, the arrays of the same length. It returns the
// ids of the rows it inserted: the others were processed before. Rows go in id order, so
// that batches that share messages (redeliveries racing) wait for each other's rows in the
// same order and do not deadlock.
// On a partitioned table, the rows of messages no partition holds yet, under their advisory
// locks (partition.go): each message looked for by the key's index of each partition, a
// nested loop that LATERAL ... LIMIT 1 forces. As NOT EXISTS, the planner may hash every row
// of the consumer instead, and does when the current partition has no statistics yet.
const insertMessagesSQL = `INSERT INTO {{.Messages}} (consumer, message_id, message_type, received_at)
SELECT $1::text, m.id, m.type, m.received_at
FROM unnest($2::text[], $3::text[], $4::timestamptz[]) AS m(id, type, received_at)
{{- if .Partitioned}}
LEFT JOIN LATERAL (SELECT true AS seen FROM {{.Messages}} WHERE consumer = $1 AND message_id = m.id LIMIT 1) AS earlier ON true
WHERE earlier.seen IS NULL
ORDER BY m.id
{{- else}}
ORDER BY m.id
ON CONFLICT (consumer, message_id) DO NOTHING
{{- end}}
RETURNING message_id`

// processTogether is the first attempt at a batch, the one that costs the least when nothing
// fails: one insert for all its inbox rows, no savepoint, one commit. It returns errOneFailed
// when a message failed (its row refused, or fn returned an error), after rolling back:
// nothing of the attempt is committed. Another error is the transaction's, as documented on
// ProcessBatch.
func (s *Store) processTogether(ctx context.Context, db TxBeginner, consumer string, msgs []Message, invalid []error,
	fn func(ctx context.Context, tx pgx.Tx, i int) error,
) ([]Result, error) {
	results := make([]Result, len(msgs))
	first := make(map[string]int, len(msgs)) // the index of each id's first valid message
	ids := make([]string, 0, len(msgs))
	types := make([]string, 0, len(msgs))
	received := make([]time.Time, 0, len(msgs))
	for i, msg := range msgs {
		if invalid[i] != nil {
			results[i].Err = invalid[i]
			continue
		}
		if _, seen := first[msg.ID]; seen {
			// A duplicate of an earlier message of this batch: when that one fails, the
			// batch runs again with savepoints, where this one is processed if it must be.
			results[i].Duplicate = true
			continue
		}
		first[msg.ID] = i
		ids, types, received = append(ids, msg.ID), append(types, msg.Type), append(received, msg.ReceivedAt)
	}

	tx, commit, err := s.begin(ctx, db)
	if err != nil {
		return nil, Transient(fmt.Errorf("begin transaction for a batch of %d messages: %w", len(msgs), err))
	}
	// Rolling back after a successful commit is a no-op; see Process.
	defer rollback(ctx, tx)

	// failed ends the attempt after message i failed with err: when it is the batch's only
	// valid message, its failure is the batch's outcome, and nothing is to commit (the
	// attempt again would only fail it twice); else the batch runs again with savepoints.
	failed := func(i int, err error) ([]Result, error) {
		rollback(ctx, tx)
		if countValid(invalid) == 1 {
			results[i].Err = err
			return results, nil
		}
		return nil, errOneFailed
	}
	isNew := make([]bool, len(msgs))
	if len(ids) > 0 && s.tables.Partition != 0 {
		if err := s.lockMessages(ctx, tx, consumer, ids...); err != nil {
			return nil, fmt.Errorf("record a batch of %d messages: %w", len(msgs), err)
		}
	}
	if len(ids) > 0 {
		rows, err := tx.Query(ctx, s.sql.insertMessages, s.insertArgs(tx, consumer, ids, types, received)...)
		if err == nil {
			for rows.Next() {
				var id string
				if err = rows.Scan(&id); err != nil {
					rows.Close()
					break
				}
				if i, ok := first[id]; ok {
					isNew[i] = true
				}
			}
			err = cmp.Or(err, rows.Err())
		}
		if err != nil {
			// The batch again, message by message, finds out whose fault it is.
			return failed(first[ids[0]], insertFailure(msgs[first[ids[0]]].ID, err))
		}
	}
	for i := range msgs {
		switch {
		case invalid[i] != nil || results[i].Duplicate:
		case !isNew[i]:
			results[i].Duplicate = true
		case fn != nil:
			if err := fn(ctx, tx, i); err != nil {
				return failed(i, fmt.Errorf("handle message %q: %w", msgs[i].ID, err))
			}
		}
	}
	if err := commit(ctx, tx); err != nil {
		if errors.Is(err, ErrCommitUnknown) {
			err = Transient(err)
		}
		return nil, fmt.Errorf("commit a batch of %d messages: %w", len(msgs), err)
	}
	return results, nil
}

// processEachSaved runs a batch in which a message failed: each message under a savepoint
// of its own, so that one's failure rolls back only what it wrote.
func (s *Store) processEachSaved(ctx context.Context, db TxBeginner, consumer string, msgs []Message, invalid []error,
	fn func(ctx context.Context, tx pgx.Tx, i int) error,
) ([]Result, error) {
	tx, commit, err := s.begin(ctx, db)
	if err != nil {
		return nil, Transient(fmt.Errorf("begin transaction for a batch of %d messages: %w", len(msgs), err))
	}
	defer rollback(ctx, tx)

	if s.tables.Partition != 0 {
		// Every message's lock at once, in the order every transaction takes them, outside
		// the savepoints: a rollback to one would release its lock.
		var ids []string
		for i, msg := range msgs {
			if invalid[i] == nil {
				ids = append(ids, msg.ID)
			}
		}
		if err := s.lockMessages(ctx, tx, consumer, ids...); err != nil {
			return nil, fmt.Errorf("record a batch of %d messages: %w", len(msgs), err)
		}
	}
	results := make([]Result, len(msgs))
	for i, msg := range msgs {
		if invalid[i] != nil {
			results[i].Err = invalid[i]
			continue
		}
		if results[i], err = s.processSaved(ctx, tx, consumer, msg, i, fn); err != nil {
			return nil, err
		}
	}
	if err := commit(ctx, tx); err != nil {
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
		failure = insertFailure(msg.ID, cmp.Or(insertErr, closeErr)) // Close repeats the insert's error, if any
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
// the insert, and with it the whole batch. There the two go one after the other, as they do
// on a partitioned table.
func (s *Store) savepointAndInsert(ctx context.Context, tx pgx.Tx, savepoint, consumer string, msg Message) (
	tag pgconn.CommandTag, spErr, insertErr, closeErr error,
) {
	if tx.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol || s.tables.Partition != 0 {
		// On a partitioned table the insert is planned at each run (see insertArgs), which
		// a batch's statements cannot ask for.
		if _, spErr = tx.Exec(ctx, "SAVEPOINT "+savepoint); spErr != nil {
			return tag, spErr, nil, nil
		}
		tag, insertErr = tx.Exec(ctx, s.sql.insertMessage, s.insertArgs(tx, consumer, msg.ID, msg.Type, msg.ReceivedAt)...)
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

// insertFailure marks the failed insert of message id's inbox row as Process does:
// [Permanent] when PostgreSQL refused a value, else [Transient].
func insertFailure(id string, err error) error {
	err = fmt.Errorf("record message %q: %w", id, err)
	if isDataException(err) {
		return Permanent(err)
	}
	return Transient(err)
}

// countValid counts the messages without an error of validation.
func countValid(invalid []error) int {
	n := 0
	for _, err := range invalid {
		if err == nil {
			n++
		}
	}
	return n
}

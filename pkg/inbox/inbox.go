package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
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
	// (for RabbitMQ the message-id property), never a delivery tag. Required: valid UTF-8,
	// without NUL bytes, at most [MaxMessageIDBytes] bytes.
	ID string
	// Type is the message type, recorded for operators (e.g. "order.placed"). May be empty;
	// valid UTF-8, without NUL bytes, at most [MaxMessageTypeBytes] bytes.
	Type string
	// ReceivedAt is when the consumer received the message; the zero value means now.
	ReceivedAt time.Time
}

// Limits of what the inbox stores, so that a key fits the primary key's index. 255 bytes is
// also the most an AMQP 0-9-1 message-id or type property can hold.
const (
	MaxConsumerBytes    = 255
	MaxMessageIDBytes   = 255
	MaxMessageTypeBytes = 255
)

// Errors returned by [Process] and [Message.Validate] for input refused before touching the
// database, the message errors marked [Permanent]. Test for them with errors.Is.
var (
	ErrNoConsumer         = errors.New("inbox: consumer name is empty")
	ErrInvalidConsumer    = errors.New("inbox: invalid consumer name")
	ErrNoMessageID        = errors.New("inbox: message id is empty")
	ErrInvalidMessageID   = errors.New("inbox: invalid message id")
	ErrInvalidMessageType = errors.New("inbox: invalid message type")
)

// Validate reports whether the inbox can store m, by the rules of its fields. The error wraps
// [ErrNoMessageID], [ErrInvalidMessageID] or [ErrInvalidMessageType], says what is wrong
// without repeating the value, and is marked [Permanent]. [Process] calls it first; a runner
// may call it earlier to dead-letter such a message with its own reason.
func (m Message) Validate() error {
	if m.ID == "" {
		return Permanent(ErrNoMessageID)
	}
	if why := invalidText(m.ID, MaxMessageIDBytes); why != "" {
		return Permanent(fmt.Errorf("%w: %s", ErrInvalidMessageID, why))
	}
	if why := invalidText(m.Type, MaxMessageTypeBytes); why != "" {
		return Permanent(fmt.Errorf("%w: %s", ErrInvalidMessageType, why))
	}
	return nil
}

// ValidateConsumer reports whether name can be a consumer name: not empty, valid UTF-8,
// without NUL bytes, at most [MaxConsumerBytes] bytes. The error wraps [ErrNoConsumer] or
// [ErrInvalidConsumer].
func ValidateConsumer(name string) error {
	if name == "" {
		return ErrNoConsumer
	}
	if why := invalidText(name, MaxConsumerBytes); why != "" {
		return fmt.Errorf("%w: %s", ErrInvalidConsumer, why)
	}
	return nil
}

// invalidText says why s cannot be stored as text of at most limit bytes, or returns "".
func invalidText(s string, limit int) string {
	switch {
	case len(s) > limit:
		return fmt.Sprintf("%d bytes long, more than %d", len(s), limit)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}

// SQL run by Process. $1 consumer, $2 message id, $3 message type, $4 received at. It and the
// other statements are templates, rendered once per [Store] with its table names
// ({{.Messages}}: the quoted, schema-qualified inbox table).
// On a partitioned table the key does not deduplicate: the insert looks for the message in
// every partition first, under the message's advisory lock (partition.go).
const insertMessageSQL = `INSERT INTO {{.Messages}} (consumer, message_id, message_type, received_at)
{{- if .Partitioned}}
SELECT $1::text, $2::text, $3::text, $4::timestamptz
WHERE NOT EXISTS (SELECT FROM {{.Messages}} WHERE consumer = $1 AND message_id = $2)
{{- else}}
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, message_id) DO NOTHING
{{- end}}`

// Process applies a message at most once per consumer and reports whether it was a duplicate.
//
// It begins a transaction on db and records (consumer, msg.ID) in the inbox table. When the
// row is new, it calls fn with the same transaction and commits, so the inbox row and
// everything fn wrote become visible together. When the row exists the message was
// processed before: fn is not called, nothing is written, and Process returns duplicate ==
// true. Acknowledge the message to its broker in both cases, and only after Process returned
// a nil error. Both commits are [CommitReplicated]: a nil error means that the effect, or
// the inbox row that records it, survives a failover to a synchronous standby.
//
// When fn returns an error, everything is rolled back, the inbox row included, so that a
// redelivery tries again; the error is returned wrapped. A nil fn records the message
// without doing anything else. When the commit fails, the effect may or may not have
// happened; a redelivery finds out through the inbox.
//
// Process marks its own failures for [Classify], so that a runner tells the
// infrastructure's fault from the message's: an invalid consumer name wraps
// [ErrNoConsumer] or [ErrInvalidConsumer]; a message that fails [Message.Validate] returns
// its [Permanent] error; a failed begin is [Transient]; a failed insert of the inbox row is
// [Permanent] when PostgreSQL refused a value (SQLSTATE classes 22 and 54, say in a non-UTF8
// database) and [Transient] otherwise, since the statement is fixed; fn's error and a failed
// commit are returned for Classify to judge, but a commit of unknown outcome
// ([ErrCommitUnknown]) and an unconfirmed duplicate are [Transient].
//
// Two deliveries of the same message processed at once (a redelivery racing the original,
// two replicas) serialise on the inbox row: at READ COMMITTED, the PostgreSQL default, the
// second waits for the first, then reports a duplicate, or runs fn if the first rolled back;
// under REPEATABLE READ or SERIALIZABLE it fails with a serialization error, and its
// redelivery is a duplicate. Either way fn's effects are committed once. On a partitioned
// table ([Tables.Partition]) the copies serialise on an advisory lock of the message instead,
// and Process runs at READ COMMITTED only: in a transaction at another level it returns an
// error that wraps [ErrIsolation].
//
// Process makes no span of its own: a duplicate sets [AttrDuplicate], true, on the recording
// span of ctx, if any, and fn's spans nest under it. It records messages in the table of the
// default [Tables]; [Store.Process] in another.
func Process(ctx context.Context, db TxBeginner, consumer string, msg Message, fn func(ctx context.Context, tx pgx.Tx) error) (duplicate bool, err error) {
	return defaultStore.Process(ctx, db, consumer, msg, fn)
}

// Process is [Process] for the store's table: messages are deduplicated per table (and per
// consumer within it).
func (s *Store) Process(ctx context.Context, db TxBeginner, consumer string, msg Message, fn func(ctx context.Context, tx pgx.Tx) error) (duplicate bool, err error) {
	if err := ValidateConsumer(consumer); err != nil {
		return false, err
	}
	if err := msg.Validate(); err != nil {
		return false, err
	}
	receivedAt := msg.ReceivedAt
	if receivedAt.IsZero() {
		receivedAt = time.Now()
	}

	tx, commit, err := s.begin(ctx, db)
	if err != nil {
		return false, Transient(fmt.Errorf("begin transaction for message %q: %w", msg.ID, err))
	}
	// Rolling back after a successful commit is a no-op. A cancelled ctx must not prevent the
	// rollback, or the connection would go back to a pool inside a failed transaction.
	defer rollback(ctx, tx)

	if s.tables.Partition != 0 {
		if err := s.lockMessages(ctx, tx, consumer, msg.ID); err != nil {
			return false, fmt.Errorf("record message %q: %w", msg.ID, err)
		}
	}
	tag, err := tx.Exec(ctx, s.sql.insertMessage, s.insertArgs(tx, consumer, msg.ID, msg.Type, receivedAt)...)
	if err != nil {
		err = fmt.Errorf("record message %q: %w", msg.ID, err)
		if isDataException(err) {
			return false, Permanent(err)
		}
		return false, Transient(err)
	}
	if tag.RowsAffected() == 0 {
		// Processed before, as far as this server knows. The inbox row may be on the primary
		// alone (its commit's wait for the standby was cancelled, and Process returned an
		// error), so the duplicate is confirmed like a commit before it is acknowledged.
		markDuplicate(ctx)
		if err := commit(ctx, tx); err != nil {
			return false, Transient(fmt.Errorf("confirm duplicate message %q: %w", msg.ID, err))
		}
		return true, nil
	}
	if fn != nil {
		if err := fn(ctx, tx); err != nil {
			return false, fmt.Errorf("handle message %q: %w", msg.ID, err)
		}
	}
	if err := commit(ctx, tx); err != nil {
		if errors.Is(err, ErrCommitUnknown) {
			err = Transient(err)
		}
		return false, fmt.Errorf("commit message %q: %w", msg.ID, err)
	}
	return false, nil
}

// AttrDuplicate is the attribute a duplicate's span carries (see [Process]).
const AttrDuplicate = attribute.Key("inbox.duplicate")

// markDuplicate marks the span of ctx, if it records, as a duplicate's.
func markDuplicate(ctx context.Context) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(AttrDuplicate.Bool(true))
	}
}

// rollback ends tx, also when ctx is already cancelled, within a few seconds.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // pgx closes the connection itself when the rollback fails
}

package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/pgpartition"
)

// A partitioned inbox ([Tables.Partition]) is one table partitioned by range of processed_at:
// every row goes to the partition of the time its transaction began, and a partition whose
// range ended Retention ago holds only rows Cleanup would delete, so Cleanup drops it whole
// (once no transaction that began in its range is open: see pgpartition.Table.DropConcurrently).
// Migrate and Cleanup make the partitions ahead of time, with package pgpartition (a message
// whose row falls in no partition fails as the database's fault, and is held).
//
// The key does not deduplicate any more: a unique index of a partitioned table must hold the
// partition key, so (consumer, message_id, processed_at) lets a copy processed in the next
// partition in. Process deduplicates instead: it takes a transaction-level advisory lock per
// message (its own statement, so that the copy waiting on it reads, once it has it, what the
// holder committed), then inserts the row only if no partition holds one for (consumer,
// message_id), which the key's index finds in each partition. Copies of a message meet
// whatever time the producer stamped on them, or none. That takes READ COMMITTED: under
// REPEATABLE READ the insert would read a snapshot taken before the lock was had.

// MaxPartitions is the most partitions [Cleanup] keeps a partitioned inbox to: those of its
// retention, of the time ahead it makes them for, and the current one. Every message looks
// for an earlier copy of itself in each partition, taking a lock on each and on its index:
// the partitions cost every message, and the locks fill PostgreSQL's lock table
// (max_locks_per_transaction × max_connections slots, 6,400 by default) with transactions of
// about 2×MaxPartitions + batch size locks each. Cleanup refuses a CleanupConfig that would
// keep more; make partitions longer, or the retention shorter.
const MaxPartitions = 64

// ErrIsolation is wrapped by the error of [Process] and [ProcessBatch] on a partitioned table
// ([Tables.Partition]) in a transaction whose isolation is not READ COMMITTED. It is marked
// [Transient]: the message is not at fault, and is held until the setting is fixed.
var ErrIsolation = errors.New("inbox: a partitioned inbox deduplicates at READ COMMITTED only")

// lockMessagesSQL takes the advisory locks of a partitioned inbox's messages, $2 (their
// keys: see messageLocks) in the order given, and reads the transaction's isolation. Their
// class is the table's oid, the table $1 resolves to: two stores that name one table
// differently ("inbox_messages", "public"."inbox_messages") take the same locks, and two
// inboxes' messages never wait for each other. A transaction that already holds one takes it
// again at no cost.
const lockMessagesSQL = `SELECT current_setting('transaction_isolation'), count(pg_advisory_xact_lock(to_regclass($1)::oid::int4, k))
FROM unnest($2::int4[]) AS k`

// messageLocks returns the advisory lock keys of the messages ids of consumer, each once, in
// ascending order, so that transactions taking several wait for each other without
// deadlocking. Two messages that share a key (one in 2³² pairs) only wait for each other.
func messageLocks(consumer string, ids ...string) []int32 {
	keys := make([]int32, 0, len(ids))
	for _, id := range ids {
		h := fnv.New32a()
		// No NUL in a valid consumer or id: the pair is unambiguous.
		fmt.Fprintf(h, "%s\x00%s", consumer, id)
		keys = append(keys, int32(h.Sum32())) //nolint:gosec // any 32 bits will do
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// lockMessages takes the advisory locks of messages ids of consumer on a partitioned table
// (see the comment at the top of this file), in a statement of its own. It returns
// ErrIsolation, [Transient], when tx is not at READ COMMITTED.
func (s *Store) lockMessages(ctx context.Context, tx pgx.Tx, consumer string, ids ...string) error {
	var isolation string
	var n int64
	if err := tx.QueryRow(ctx, lockMessagesSQL, s.text, messageLocks(consumer, ids...)).Scan(&isolation, &n); err != nil {
		return Transient(fmt.Errorf("lock %d messages: %w", len(ids), err))
	}
	if isolation != "read committed" {
		return Transient(fmt.Errorf("%w; this transaction is at %s", ErrIsolation, isolation))
	}
	return nil
}

// insertArgs are the arguments of an insert of inbox rows. On a partitioned table the insert
// is planned at each run, with pgx.QueryExecModeExec, never from a cached generic plan: its
// look for an earlier copy reads the current partition, which starts empty, and a plan made
// then (a sequential scan, the cheapest of an empty table) would go on scanning it whole for
// every message as it grows, until an ANALYZE of it invalidates the plan. A plan made at the
// run sees the partition's size as it is.
func (s *Store) insertArgs(tx pgx.Tx, args ...any) []any {
	if s.tables.Partition == 0 || tx.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		return args // the simple protocol plans at each run too
	}
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// begin begins the transaction of Process and ProcessBatch (see beginReplicated). On a
// partitioned table, a transaction the store begins itself is at READ COMMITTED, whatever the
// session's default_transaction_isolation; one it is given (db a pgx.Tx) is what its caller
// made it, and lockMessages refuses another level.
func (s *Store) begin(ctx context.Context, db TxBeginner) (pgx.Tx, func(context.Context, pgx.Tx) error, error) {
	var iso pgx.TxIsoLevel // the session's default
	if s.tables.Partition != 0 {
		iso = pgx.ReadCommitted
	}
	return beginReplicated(ctx, db, iso)
}

// partitioned is the table as package pgpartition keeps it.
func (s *Store) partitioned() pgpartition.Table {
	n := s.tables.sqlNames()
	return pgpartition.Table{
		Library: "inbox", Qualified: n.Messages, Text: n.MessagesText, Column: "processed_at",
		Every: s.tables.Partition, Base: s.tables.Messages,
	}
}

// checkLayout reports whether the table is laid out as s's Tables say (see
// pgpartition.Table.CheckLayout).
func (s *Store) checkLayout(ctx context.Context, db pgpartition.Querier) error {
	return s.partitioned().CheckLayout(ctx, db, s.tables.String())
}

// checkLayoutOn runs s.checkLayout on db, in a transaction of its own when db cannot run
// queries itself.
func checkLayoutOn(ctx context.Context, db any, s *Store) error {
	if d, ok := db.(pgpartition.Querier); ok {
		return s.checkLayout(ctx, d)
	}
	b, ok := db.(TxBeginner)
	if !ok {
		return fmt.Errorf("inbox: a %T can neither run queries nor begin a transaction", db)
	}
	return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return s.checkLayout(ctx, tx) })
}

// checkPartitions returns an error when a retention and partitions made ahead that far (0:
// the default) would keep more than MaxPartitions partitions.
func (s *Store) checkPartitions(retention, ahead time.Duration) error {
	p := s.tables.Partition
	ahead = s.partitioned().Ahead(ahead)
	// The retention's partitions, the one it begins in, the current one and those ahead.
	if n := int64(retention/p) + 2 + int64((ahead+p-1)/p); n > MaxPartitions {
		return fmt.Errorf("inbox: a retention of %s with partitions made %s ahead keeps %d partitions of %s, more than %d (MaxPartitions): every message looks in each; make partitions longer, or the retention or CleanupConfig.PartitionsAhead shorter",
			retention, ahead, n, p, MaxPartitions)
	}
	return nil
}

// createPartitions makes the partitions from the current one to ahead from now (0: the
// default), and returns how many it made; another process making them at the same time
// makes it do nothing (see pgpartition.Table.Create).
func (s *Store) createPartitions(ctx context.Context, db any, ahead time.Duration, log *slog.Logger) (int, error) {
	made, err := s.partitioned().Create(ctx, db, s.partitioned().Ahead(ahead), false, log)
	if err != nil {
		return made, fmt.Errorf("inbox: make partitions of %s: %w", s.tables, err)
	}
	return made, nil
}

// dropPartitions drops the partitions whose range ended by cutoff, and returns how many rows
// they held. Every row of such a partition was processed before cutoff: none keeps it, so
// nothing is to be looked at again under a lock, and each is detached without one (see
// pgpartition.Table.DropConcurrently): consumers whose transactions overlap, long ones
// included, never leave the table's ACCESS EXCLUSIVE lock a moment free, and are never held
// up by a drop.
func (s *Store) dropPartitions(ctx context.Context, db any, cutoff time.Time, log *slog.Logger) (int64, error) {
	retired, err := s.partitioned().DropConcurrently(ctx, db, cutoff, log)
	if err != nil {
		return retired, fmt.Errorf("inbox: %s: %w", s.tables, err)
	}
	return retired, nil
}

// PartitionsEnd returns where the last partition of the store's partitioned table
// ([Tables.Partition]) ends: a message processed after it fails, as the database's fault,
// until Cleanup makes more. It is the zero time when the table has no partition. The bounds
// are read back as text, which only DateStyle ISO (PostgreSQL's default) writes
// unambiguously: a session in another is refused. A store of a plain table returns an error.
func (s *Store) PartitionsEnd(ctx context.Context, db Execer) (time.Time, error) {
	if s.tables.Partition == 0 {
		return time.Time{}, fmt.Errorf("inbox: %s is not partitioned (Tables.Partition)", s.tables)
	}
	var end *time.Time
	var dateStyle string
	if err := db.QueryRow(ctx, pgpartition.EndSQL, s.tables.sqlNames().MessagesText).Scan(&end, &dateStyle); err != nil {
		return time.Time{}, fmt.Errorf("inbox: read where the partitions of %s end: %w", s.tables, err)
	}
	if err := pgpartition.CheckDateStyle(dateStyle); err != nil {
		return time.Time{}, fmt.Errorf("inbox: %w", err)
	}
	if end == nil {
		return time.Time{}, nil
	}
	return *end, nil
}

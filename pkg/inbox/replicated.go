package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrCommitUnknown is wrapped by [CommitReplicated] when the commit returned after ctx had
// ended. Do not acknowledge: a retry finds what was committed, and confirms it in turn.
var ErrCommitUnknown = errors.New("inbox: commit outcome unknown: the wait for the synchronous standby may have been cut short")

// replicationBarrier readies a transaction to be acknowledged on a primary with synchronous
// standbys. Under synchronous replication a COMMIT that wrote WAL waits until the standbys
// have its commit record, and with it every commit before it in the WAL; but a transaction
// that only read writes no WAL and waits for nothing (taking a transaction id is not
// enough: PostgreSQL waits only for a transaction that wrote WAL), although what it read may
// be on the primary alone: a commit whose wait for the standby was cut short (its backend
// cancelled or terminated) is committed and visible there, and so is everything a primary
// restarted after a crash replays, whether or not the standby ever got it. So:
//
//   - the transaction writes a transactional logical message (pg_logical_emit_message, at
//     any wal_level, from any role, also in a read-only transaction), so that its COMMIT
//     writes a commit record later in the WAL than every commit it saw, and waits for it;
//     only when synchronous_standby_names is set, since without synchronous standbys there
//     is nothing to wait for and the record would cost a WAL flush, and not on a standby
//     (a hot standby that shares the primary's settings), which writes no WAL and has only
//     what it was sent. A logical decoder sees
//     the message under the prefix "inbox.replicated" and may skip it;
//   - synchronous_commit is at least on (off and local do not wait for the standby).
const replicationBarrier = `
SELECT CASE WHEN current_setting('synchronous_standby_names') <> '' AND NOT pg_is_in_recovery()
            THEN pg_logical_emit_message(true, 'inbox.replicated', '') END,
       set_config('synchronous_commit',
                  CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
                       ELSE current_setting('synchronous_commit') END, true)`

// CommitReplicated commits tx so that its success can be acknowledged even on a primary
// with synchronous standbys: when it returns nil, all that tx wrote and all that it read is
// on the synchronous standbys (if the server has any), and survives a failover to one of
// them, which a plain tx.Commit of a transaction that only read does not promise. [Process]
// commits with it; use it instead of tx.Commit wherever you answer someone from a
// transaction, above all from what it only read (the replay of an idempotent request). Call
// it on the outermost transaction: on a savepoint it proves nothing. What it costs: see the
// README's Operations.
//
// An error means the outcome is unknown, as with any failed commit: when ctx ends while the
// commit waits for the standby, or the commit returns after ctx ended (then it wraps
// [ErrCommitUnknown]: the wait may have been cut short, leaving the commit on the primary
// alone). Never treat such a transaction as done. With a single synchronous standby that is
// down, it waits until the standby is back or ctx ends.
func CommitReplicated(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, replicationBarrier); err != nil {
		return fmt.Errorf("ready the commit for the synchronous standbys: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w (%w)", ErrCommitUnknown, err)
	}
	return nil
}

// replicatedCommitSQL commits a transaction begun by beginReplicated: the replication
// barrier and the COMMIT in one query string, one round trip (pgx sends a statement without
// arguments in the simple protocol, where a string may hold several). When the barrier
// fails, the COMMIT does not run, the transaction stays failed, and pgx closes the
// connection, as after any failed commit.
const replicatedCommitSQL = replicationBarrier + ";\nCOMMIT"

// txOptionsBeginner is what a *pgxpool.Pool and a *pgx.Conn offer beyond Begin.
type txOptionsBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// beginReplicated begins a transaction on db and returns it with the function that commits
// it as [CommitReplicated] does. On a pool or a connection (a db with BeginTx) the
// transaction's commit carries the barrier, which saves a round trip per transaction; on a
// pgx.Tx, whose Begin opens a savepoint, the commit is CommitReplicated itself.
func beginReplicated(ctx context.Context, db TxBeginner, iso pgx.TxIsoLevel) (pgx.Tx, func(context.Context, pgx.Tx) error, error) {
	b, ok := db.(txOptionsBeginner)
	if !ok {
		tx, err := db.Begin(ctx)
		return tx, CommitReplicated, err
	}
	tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso, CommitQuery: replicatedCommitSQL})
	return tx, commitWithBarrier, err
}

// commitWithBarrier commits a transaction begun with replicatedCommitSQL as its commit: its
// outcome is CommitReplicated's.
func commitWithBarrier(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w (%w)", ErrCommitUnknown, err)
	}
	return nil
}

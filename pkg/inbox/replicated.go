package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrCommitUnknown is wrapped by [CommitReplicated] when the commit returned after ctx had
// ended: the commit's wait for the synchronous standby may have been cut short (a cancelled
// backend returns success with a warning), in which case the transaction is committed on the
// primary alone and may not survive a failover. Treat it as any failed commit whose outcome
// is unknown: do not acknowledge, let the caller retry (the retry finds what was committed,
// and confirms it in turn).
var ErrCommitUnknown = errors.New("commit outcome unknown: the wait for the synchronous standby may have been cut short")

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
// them.
//
// [Process] commits with it, so a delivery is acknowledged only once its effect, or for a
// duplicate the inbox row that says it was applied, is on the standbys. Use it, instead of
// tx.Commit, for every other transaction whose success you report to someone who will act
// on it: an API's answer to a write, and above all an answer built from what a transaction
// only read — the replay of an idempotent request, a read that a client takes as
// confirmation. A plain tx.Commit of a read-only transaction waits for no standby, so a row
// committed on the primary alone (a commit whose wait for the standby was cancelled, or the
// replay of a crashed and restarted primary) would be acknowledged and then lost in the
// failover.
//
// It costs one statement more than tx.Commit; without synchronous standbys nothing else
// (but a session whose synchronous_commit is off or local now flushes that commit). With
// them, a transaction that only read pays a WAL record, a transaction id, a local flush and
// the standby's round trip. Call it on the outermost transaction: on a nested one (a
// savepoint) the commit only releases the savepoint, and proves nothing.
//
// An error means the outcome is unknown, as with any failed commit: when ctx ends while
// the commit waits for the standby (pgx then closes the connection; the server goes on
// waiting, and the transaction becomes visible once the standby has it, or at once if the
// wait is cancelled on the server), or the commit returns after ctx ended, it is an error,
// wrapping [ErrCommitUnknown] in the latter case: never cut the wait short and then treat
// the transaction as done. With a single synchronous standby that is down,
// CommitReplicated waits until the standby is back or ctx ends.
func CommitReplicated(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, replicationBarrier); err != nil {
		return fmt.Errorf("inbox: ready the commit for the synchronous standbys: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("inbox: %w (%w)", ErrCommitUnknown, err)
	}
	return nil
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrCommitUnknown is wrapped by [CommitReplicated] when the commit returned after ctx had
// ended, its wait for the synchronous standby perhaps cut short: as for any commit whose
// outcome is unknown, do not acknowledge; let the caller retry.
var ErrCommitUnknown = errors.New("outbox: commit outcome unknown: the wait for the synchronous standby may have been cut short")

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
//     the message under the prefix "outbox.replicated" and may skip it;
//   - synchronous_commit is at least on (off and local do not wait for the standby).
//
// It also returns the server's start time, which tells one server from another: the relay
// checks that its barrier ran where its claim did.
const replicationBarrier = `
SELECT CASE WHEN current_setting('synchronous_standby_names') <> '' AND NOT pg_is_in_recovery()
            THEN pg_logical_emit_message(true, 'outbox.replicated', '') END,
       set_config('synchronous_commit',
                  CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
                       ELSE current_setting('synchronous_commit') END, true),
       pg_postmaster_start_time()`

// CommitReplicated commits tx so that its success can be acknowledged on a primary with
// synchronous standbys: when it returns nil, all that tx wrote and all that it read is on the
// synchronous standbys (if any) and survives a failover. Use it instead of tx.Commit, on the
// outermost transaction, whenever you report its success to someone who acts on it, above
// all when it only read (README.md#operations). It costs one statement more; with
// synchronous standbys, a transaction that only read also pays a WAL record and the
// standby's round trip, and with the one standby down it waits until it is back or ctx ends.
// An error means the outcome is unknown, as with any failed commit ([ErrCommitUnknown]).
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

// rollback ends tx, also when ctx is already cancelled, within a few seconds; after a
// successful commit it does nothing.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // pgx closes the connection itself when the rollback fails
}

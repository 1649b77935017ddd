package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/pgpartition"

	"github.com/jackc/pgx/v5"
)

// Stats is a snapshot of the outbox table.
type Stats struct {
	// Pending counts rows not yet published and not dead: the backlog.
	Pending int64
	// OldestPending is when the oldest pending row was written; zero when none is pending.
	OldestPending time.Time
	// Dead counts rows that gave up.
	Dead int64
	// PartitionsEnd is, for a partitioned table ([Tables.Partition]), where its last
	// partition ends: a row written after it has no partition, and its writer fails. Cleanup
	// keeps it [CleanupConfig].PartitionsAhead ahead of now. Zero for a plain table.
	PartitionsEnd time.Time
}

// statsQuery reads the pending rows once through their partial index, and the dead ones
// through theirs: its cost is the backlog plus the dead rows, however many published rows the
// table keeps (a few milliseconds for 50,000 pending rows). The oldest pending row is the one
// with the earliest created_at, not the smallest seq: a row's seq is taken when it is
// inserted, its created_at when its transaction began, so a long transaction's row can be
// older than rows ahead of it.
const statsQuery = `
SELECT p.pending, p.oldest, (SELECT count(*) FROM {{.Messages}} WHERE dead_at IS NOT NULL)
FROM (SELECT count(*) AS pending, min(created_at) AS oldest
      FROM {{.Messages}} WHERE published_at IS NULL AND dead_at IS NULL) p`

// ReadStats returns the backlog, the age of its oldest row and the number of dead rows, in
// time proportional to the backlog. Call it at an interval from a process other than the
// relay (outboxmetrics.Stats does), so that a dead relay's backlog stays visible.
func ReadStats(ctx context.Context, db DBTX) (Stats, error) {
	return defaultStore.ReadStats(ctx, db)
}

// ReadStats is [ReadStats] for the store's table.
func (s *Store) ReadStats(ctx context.Context, db DBTX) (Stats, error) {
	var (
		st     Stats
		oldest *time.Time
	)
	if err := db.QueryRow(ctx, s.sql.stats).Scan(&st.Pending, &oldest, &st.Dead); err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	if oldest != nil {
		st.OldestPending = *oldest
	}
	if s.tables.Partition != 0 {
		var end *time.Time
		var dateStyle string
		if err := db.QueryRow(ctx, pgpartition.EndSQL, s.tables.sqlNames().MessagesText).Scan(&end, &dateStyle); err != nil {
			return Stats{}, fmt.Errorf("read outbox stats: where the partitions end: %w", err)
		}
		if err := pgpartition.CheckDateStyle(dateStyle); err != nil {
			return Stats{}, fmt.Errorf("read outbox stats: %w", err)
		}
		if end != nil {
			st.PartitionsEnd = *end
		}
	}
	return st, nil
}

// SlotStats is a snapshot of a [WALRelay]'s replication slot, as the server sees it.
type SlotStats struct {
	// Exists says the slot exists; the other fields are zero when it does not.
	Exists bool
	// Active says a relay streams it now.
	Active bool
	// Lost says the server invalidated it: it kept more WAL than max_slot_wal_keep_size, and
	// the WAL it needed is gone. The relay drops it and creates it again at its next session.
	Lost bool
	// LagBytes is the WAL written since the slot's confirmed position: what the relay has
	// not yet confirmed (not only outbox rows: every table's changes count).
	LagBytes int64
	// RetainedBytes is the WAL the server keeps for the slot (since its restart position).
	RetainedBytes int64
	// SafeBytes is the WAL that may still be written before the server invalidates the slot
	// (safe_wal_size); -1 when max_slot_wal_keep_size sets no limit.
	SafeBytes int64
}

// slotStatsQuery reads slot $1, if it is this database's (a slot's name is the server's:
// another database's slot of that name is another outbox's), or a physical slot (which keeps
// WAL all the same). Positions are against the server's current WAL position (its replay
// position on a standby, which has no slot of its own in PostgreSQL 15).
const slotStatsQuery = `
WITH now AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
SELECT active, coalesce(wal_status = 'lost', false),
       coalesce(pg_wal_lsn_diff(now.lsn, confirmed_flush_lsn), 0)::bigint,
       coalesce(pg_wal_lsn_diff(now.lsn, restart_lsn), 0)::bigint,
       coalesce(safe_wal_size, -1)
FROM pg_replication_slots, now WHERE slot_name = $1 AND (database IS NULL OR database = current_database())`

// ReadSlotStats reads the state of replication slot slot (empty: the table's
// [Tables.WALName]) from pg_replication_slots, which any role may read. Call it, like
// ReadStats, from a process other than the relay (outboxmetrics.Stats does).
func (s *Store) ReadSlotStats(ctx context.Context, db DBTX, slot string) (SlotStats, error) {
	slot = cmp.Or(slot, s.tables.WALName())
	st := SlotStats{Exists: true}
	err := db.QueryRow(ctx, slotStatsQuery, slot).Scan(&st.Active, &st.Lost, &st.LagBytes, &st.RetainedBytes, &st.SafeBytes)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return SlotStats{}, nil
	case err != nil:
		return SlotStats{}, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	return st, nil
}

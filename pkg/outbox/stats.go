package outbox

import (
	"context"
	"fmt"
	"time"
)

// Stats is a snapshot of the outbox table.
type Stats struct {
	// Pending counts rows not yet published and not dead: the backlog.
	Pending int64
	// OldestPending is when the oldest pending row was written; zero when none is pending.
	OldestPending time.Time
	// Dead counts rows that gave up.
	Dead int64
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
	return st, nil
}

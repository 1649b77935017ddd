package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/pgpartition"
)

// A partitioned outbox ([Tables.Partition]) is one table partitioned by range of created_at.
// Migrate and Cleanup keep it, with package pgpartition: they make the partitions ahead of
// time (writers whose row falls in no partition fail), and Cleanup drops whole the
// partitions whose range ended Retention ago and that hold no pending or dead row, nor one
// published within the retention. Each such step is one short transaction. Making a
// partition takes the table's SHARE UPDATE EXCLUSIVE lock, which writers do not conflict
// with; dropping one takes its ACCESS EXCLUSIVE lock (PostgreSQL's rule for DROP, and the
// partition is looked at again under it) under pgpartition.LockTimeout: writers wait at most
// that long behind it.

// partitionKeeps tells whether the partition (%s) holds a row that keeps it: pending or dead
// (both through their partial indexes), or published since $1, the retention's cutoff (a
// row published late, requeued say, is kept as long as any other).
const partitionKeeps = `
SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NULL AND dead_at IS NULL)
    OR EXISTS (SELECT 1 FROM %[1]s WHERE dead_at IS NOT NULL)
    OR EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NOT NULL AND published_at >= $1)`

// partitioned is the table as package pgpartition keeps it.
func (s *Store) partitioned() pgpartition.Table {
	n := s.tables.sqlNames()
	return pgpartition.Table{
		Library: "outbox", Qualified: n.Messages, Text: n.MessagesText, Column: "created_at",
		Every: s.tables.Partition, Base: s.tables.Messages,
	}
}

// checkLayout reports whether the table is laid out as s's Tables say (see
// pgpartition.Table.CheckLayout).
func (s *Store) checkLayout(ctx context.Context, db DBTX) error {
	return s.partitioned().CheckLayout(ctx, db, s.tables.String())
}

// createPartitions makes the partitions from the current one to ahead from now (0: the
// default), and returns how many it made; another process making them at the same time
// makes it do nothing (see pgpartition.Table.Create).
func (s *Store) createPartitions(ctx context.Context, db DBTX, ahead time.Duration, log *slog.Logger) (int, error) {
	made, err := s.partitioned().Create(ctx, db, s.partitioned().Ahead(ahead), false, log)
	if err != nil {
		return made, fmt.Errorf("outbox: make partitions of %s: %w", s.tables, err)
	}
	return made, nil
}

// dropPartitions drops the partitions whose range ended before cutoff and that hold no
// pending or dead row, nor one published since cutoff, and returns how many rows they held,
// and whether another process was at it (see pgpartition.Table.Drop). A partition that holds
// such a row is kept; Cleanup's DELETE then removes its published rows as their own
// retention ends.
func (s *Store) dropPartitions(ctx context.Context, db DBTX, cutoff time.Time, log *slog.Logger) (int64, bool, error) {
	retired, another, err := s.partitioned().Drop(ctx, db, cutoff, partitionKeeps, log)
	if err != nil {
		return retired, false, fmt.Errorf("outbox: %s: %w", s.tables, err)
	}
	return retired, another, nil
}

// droppableBefore is where, on a partitioned table, the row DELETE of Cleanup stops: the
// grid's boundary at or before cutoff, where the partitions old enough to be dropped end.
// The newer ones are left whole to be dropped; the rows before it that are still there are
// in partitions kept for their pending, dead or late rows.
func droppableBefore(cutoff time.Time, every time.Duration) time.Time {
	return cutoff.Truncate(every)
}

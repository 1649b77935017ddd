package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// A partitioned outbox ([Tables.Partition]) is one table partitioned by range of created_at.
// Cleanup keeps it: it makes the partitions ahead of time (writers whose row falls in no
// partition fail), and drops whole the partitions whose range ended Retention ago and that
// hold no pending or dead row. Each such step is one short transaction that takes the
// table's ACCESS EXCLUSIVE lock (PostgreSQL takes it to attach or drop a partition) under
// partitionLockTimeout: writers wait at most that long behind it, and a step that does not
// get the lock in time is left to the next run.

// partitionLockTimeout bounds how long a partition step waits for the table's lock, and so
// how long the writers queued behind it wait.
const partitionLockTimeout = 200 * time.Millisecond

// minPartitionsAhead is the least time ahead of now that Cleanup keeps partitions made,
// whatever their length: an hour of Cleanup's outage costs the writers nothing.
const minPartitionsAhead = time.Hour

// tableLayout reads how the table $1 (its quoted name) is partitioned: whether it is a
// partitioned table, whether by range of created_at alone, and whether it has a DEFAULT
// partition.
const tableLayout = `
SELECT c.relkind = 'p',
       coalesce((SELECT pt.partstrat = 'r' AND pt.partnatts = 1 AND a.attname = 'created_at'
                 FROM pg_partitioned_table pt
                 JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
                 WHERE pt.partrelid = c.oid), false),
       coalesce((SELECT pt.partdefid <> 0 FROM pg_partitioned_table pt WHERE pt.partrelid = c.oid), false)
FROM pg_class c WHERE c.oid = to_regclass($1)`

// listPartitions lists the partitions of the table $1 (its quoted name) with their range,
// oldest first. A bound that is not a timestamp (MINVALUE, MAXVALUE; DEFAULT has neither) is
// NULL: Cleanup never drops such a partition, nor makes one over it. The bounds are read
// back from their text: a session in ISO DateStyle writes them with numeric offsets.
const listPartitions = `
SELECT c.oid::regclass::text,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)
ORDER BY 3 NULLS FIRST`

// partitionsEnd is where the last partition of the table $1 (its quoted name) ends, of those
// whose upper bound is a timestamp (not MAXVALUE, not DEFAULT); NULL when there are none.
const partitionsEnd = `
SELECT (SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass($1)),
       current_setting('DateStyle')`

// partitionKeeps tells whether the partition (%s) holds a row that keeps it: pending or dead
// (both through their partial indexes), or published since $1, the retention's cutoff (a
// row published late, requeued say, is kept as long as any other).
const partitionKeeps = `
SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NULL AND dead_at IS NULL)
    OR EXISTS (SELECT 1 FROM %[1]s WHERE dead_at IS NOT NULL)
    OR EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NOT NULL AND published_at >= $1)`

// partitionCount counts a partition's (%s) rows, for Cleanup's count.
const partitionCount = `SELECT count(*) FROM %s`

// partition is one partition of the table, as listPartitions reads it.
type partition struct {
	name         string // quoted (regclass's text: qualified unless on search_path)
	lower, upper *time.Time
}

// checkLayout reports whether the table is laid out as s's Tables say: partitioned by
// created_at, without a DEFAULT partition, when Partition is set; a plain table when not.
func (s *Store) checkLayout(ctx context.Context, db DBTX) error {
	var partitioned, byCreatedAt, withDefault bool
	if err := db.QueryRow(ctx, tableLayout, s.tables.sqlNames().MessagesText).Scan(&partitioned, &byCreatedAt, &withDefault); err != nil {
		return fmt.Errorf("outbox: read how %s is laid out: %w", s.tables, err)
	}
	switch {
	case s.tables.Partition != 0 && !partitioned:
		return fmt.Errorf("outbox: Tables.Partition is %s but %s is a plain table: it is not converted in place (README.md#partitioned-tables)", s.tables.Partition, s.tables)
	case s.tables.Partition != 0 && !byCreatedAt:
		return fmt.Errorf("outbox: %s is partitioned, but not by range of created_at alone", s.tables)
	case s.tables.Partition != 0 && withDefault:
		return fmt.Errorf("outbox: %s has a DEFAULT partition: a partition made for rows it holds would fail; move its rows and drop it", s.tables)
	case s.tables.Partition == 0 && partitioned:
		return fmt.Errorf("outbox: %s is a partitioned table: set Tables.Partition to its partitions' length, in every process that migrates or cleans it up (README.md#partitioned-tables)", s.tables)
	}
	return nil
}

// partitionsAhead is how far ahead of now Cleanup makes partitions when asked for ahead (0:
// three partitions, and at least minPartitionsAhead).
func (s *Store) partitionsAhead(ahead time.Duration) time.Duration {
	if ahead > 0 {
		return ahead
	}
	return max(3*s.tables.Partition, minPartitionsAhead)
}

// partitionName is the name of the partition that begins at lo: the table's name, "_p" and
// lo in UTC, to the minute.
func (s *Store) partitionName(lo time.Time) string {
	return s.tables.qualified(s.tables.Messages + "_p" + lo.UTC().Format("200601021504"))
}

// txStarter is a pool or a connection: what the partition steps run their own transactions
// on.
type txStarter interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// partitionTx runs f in a transaction of its own on db, at READ COMMITTED, that reads
// timestamps in ISO (partition bounds are read as text), waits at most partitionLockTimeout
// for a lock, and holds the table's partition lock, which serialises the partition steps of
// every process. When wait is false and another process holds that lock, f does not run and
// done is false. A transaction given as db is refused: what the steps lock and set would
// last until it ends, holding the writers up meanwhile.
func (s *Store) partitionTx(ctx context.Context, db DBTX, wait bool, f func(tx pgx.Tx) error) (done bool, err error) {
	b, ok := db.(txStarter)
	if _, isTx := db.(pgx.Tx); isTx || !ok {
		return false, fmt.Errorf("outbox: a partitioned table's steps run transactions of their own: give a pool or a connection, not a %T", db)
	}
	err = pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true), set_config('DateStyle', 'ISO', true)",
			fmt.Sprintf("%dms", partitionLockTimeout.Milliseconds())); err != nil {
			return err
		}
		key := s.tables.lockKey("partition", partitionLock)
		if wait {
			done = true
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
				return err
			}
		} else if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&done); err != nil || !done {
			return err
		}
		return f(tx)
	})
	return done, err
}

// readPartitions lists the table's partitions and reads the database's clock. Run it in a
// partitionTx: bounds are read in ISO.
func (s *Store) readPartitions(ctx context.Context, tx pgx.Tx) (now time.Time, parts []partition, err error) {
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return now, nil, err
	}
	rows, err := tx.Query(ctx, listPartitions, s.tables.sqlNames().MessagesText)
	if err != nil {
		return now, nil, err
	}
	parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (p partition, err error) {
		return p, r.Scan(&p.name, &p.lower, &p.upper)
	})
	return now, parts, err
}

// missingPartitions returns the ranges to make so that partitions cover from the start of
// now's partition to now+ahead: the grid's ranges (multiples of every since the Unix epoch),
// cut where a partition already covers part of one. A bound that is not a timestamp is
// infinite (MINVALUE, MAXVALUE).
func missingPartitions(now time.Time, ahead, every time.Duration, parts []partition) [][2]time.Time {
	var out [][2]time.Time
	end := now.Add(ahead)
	for t := now.Truncate(every); t.Before(end); {
		covered := false
		hi := t.Truncate(every).Add(every)
		for _, p := range parts {
			if p.lower == nil && p.upper == nil {
				continue // DEFAULT, which checkLayout refuses
			}
			if (p.lower == nil || !t.Before(*p.lower)) && (p.upper == nil || t.Before(*p.upper)) {
				if p.upper == nil {
					return out // up to MAXVALUE
				}
				t, covered = *p.upper, true // t is in p: go on from its end
				break
			}
			if p.lower != nil && p.lower.After(t) && p.lower.Before(hi) { // p begins inside t's range
				hi = *p.lower
			}
		}
		if !covered {
			out = append(out, [2]time.Time{t, hi})
			t = hi
		}
	}
	return out
}

// createPartitions makes the partitions missing from the start of the current one to
// ahead from now (see missingPartitions), each in a transaction of its own, and returns how
// many it made. When wait is false, another process making them at the same time makes it
// do nothing.
func (s *Store) createPartitions(ctx context.Context, db DBTX, ahead time.Duration, wait bool, log *slog.Logger) (made int, err error) {
	for {
		var more bool
		done, err := s.partitionTx(ctx, db, wait, func(tx pgx.Tx) error {
			now, parts, err := s.readPartitions(ctx, tx)
			if err != nil {
				return err
			}
			missing := missingPartitions(now, s.partitionsAhead(ahead), s.tables.Partition, parts)
			if len(missing) == 0 {
				return nil
			}
			// One partition per transaction: the table's lock is held for one catalog change.
			r, name := missing[0], s.partitionName(missing[0][0])
			create := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
				name, s.tables.sqlNames().Messages, pgTimestamp(r[0]), pgTimestamp(r[1]))
			if _, err := tx.Exec(ctx, create); err != nil {
				return fmt.Errorf("make partition %s: %w", name, err)
			}
			log.InfoContext(ctx, "outbox partition made", slog.String("partition", name),
				slog.Time("from", r[0]), slog.Time("to", r[1]))
			made++
			more = len(missing) > 1
			return nil
		})
		if err != nil {
			return made, fmt.Errorf("outbox: make partitions of %s: %w", s.tables, err)
		}
		if !done || !more {
			return made, nil
		}
	}
}

// pgTimestamp writes t as a timestamptz literal's text.
func pgTimestamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") }

// dropPartitions drops the partitions whose range ended before cutoff and that hold no
// pending or dead row, nor one published since cutoff, each in a transaction of its own,
// and returns how many rows they held. A partition that holds such a row is kept; Cleanup's
// DELETE then removes its published rows as their own retention ends. A partition whose
// bounds are not timestamps is never dropped. When the table's lock is not had in time, the
// rest is left to the next run.
func (s *Store) dropPartitions(ctx context.Context, db DBTX, cutoff time.Time, log *slog.Logger) (retired int64, err error) {
	var parts []partition
	if _, err := s.partitionTx(ctx, db, true, func(tx pgx.Tx) (err error) {
		_, parts, err = s.readPartitions(ctx, tx)
		return err
	}); err != nil {
		return 0, fmt.Errorf("outbox: list partitions of %s: %w", s.tables, err)
	}
	for _, p := range parts {
		if p.lower == nil || p.upper == nil || p.upper.After(cutoff) {
			continue
		}
		var kept, gone bool
		var rows int64
		done, err := s.partitionTx(ctx, db, false, func(tx pgx.Tx) error {
			// Looked at first without the table's lock, through the partial indexes: a
			// partition kept for its dead rows costs each run these probes, not a lock.
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", p.name).Scan(&gone); err != nil || gone {
				return err // dropped by hand since it was listed
			}
			if err := tx.QueryRow(ctx, fmt.Sprintf(partitionKeeps, p.name), cutoff).Scan(&kept); err != nil || kept {
				return err
			}
			// Counted before the lock, to hold it only for the check and the drop: no row of
			// a partition this old changes but by a relay's mark or a Requeue (the check
			// again below sees those), and this transaction holds the advisory lock of every
			// cleaner's drop.
			if err := tx.QueryRow(ctx, fmt.Sprintf(partitionCount, p.name)).Scan(&rows); err != nil {
				return err
			}
			// The table's lock (ONLY: not every partition's), as the drop takes it: a
			// writer or a relay that holds it and waits for the partition's lock would
			// deadlock with a lock on the partition taken first. Then the check again: a
			// row may have come or changed since.
			if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+s.tables.sqlNames().Messages+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, fmt.Sprintf(partitionKeeps, p.name), cutoff).Scan(&kept); err != nil || kept {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+p.name)
			return err
		})
		switch {
		case isCode(err, "55P03"): // lock_not_available: busy; the next run tries again
			// A long transaction on the table keeps the lock from every partition alike.
			log.DebugContext(ctx, "outbox partition not dropped: its table is busy", slog.String("partition", p.name))
			return retired, nil
		case err != nil:
			return retired, fmt.Errorf("outbox: drop partition %s: %w", p.name, err)
		case !done:
			return retired, nil // another process is at it
		case gone:
		case kept:
			log.DebugContext(ctx, "outbox partition kept past its retention: it holds pending or dead rows, or rows published late", slog.String("partition", p.name))
		default:
			retired += rows
			log.InfoContext(ctx, "outbox partition dropped", slog.String("partition", p.name), slog.Int64("rows", rows))
		}
	}
	return retired, nil
}

// droppableBefore is where, on a partitioned table, the row DELETE of Cleanup stops: the end
// of the last partition whose range ended by cutoff. The partitions after it are left whole
// to be dropped; the rows before it that are still there are in partitions kept for their
// pending or dead rows. No partition so old: -infinity, and the DELETE deletes nothing.
func droppableBefore(cutoff time.Time, every time.Duration) time.Time {
	return cutoff.Truncate(every)
}

// Package pgpartition keeps a table partitioned by range of a timestamp column: it makes the
// partitions ahead of time, on a grid, and drops whole the ones whose range ended long enough
// ago. The outbox keeps its table partitioned by created_at with it, the inbox its table by
// processed_at.
//
// Each step (make one partition, drop one) is a transaction of its own, at READ COMMITTED,
// that waits at most [LockTimeout] for each lock it takes, and that holds an advisory lock
// serialising the steps of every process on the table. PostgreSQL takes the table's ACCESS
// EXCLUSIVE lock to attach or drop a partition, so writers queue behind a step for at most
// that long; a step that does not get a lock in time gives up (a drop is left to the next
// run; a partition not made is an error).
//
// Partition bounds are read back from their text (pg_get_expr), which a session writes
// unambiguously in ISO DateStyle: the steps set it for their own transactions.
//
// This is the source of the copies in the libraries' internal/pgpartition (a library must
// stay copyable alone): edit it here and run go generate; a test in tools fails when a copy
// drifts.
package pgpartition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LockTimeout bounds how long a step waits for each lock it takes, and so how long the
// writers queued behind it wait.
const LockTimeout = 200 * time.Millisecond

// Table is one partitioned table, as its library names it.
type Table struct {
	// Library prefixes log lines ("outbox", "inbox").
	Library string
	// Qualified is the table's quoted, schema-qualified name; Text the same for to_regclass.
	Qualified, Text string
	// Column is the partition key's column.
	Column string
	// Every is the partitions' length: they begin at multiples of it since the Unix epoch.
	Every time.Duration
	// Name returns the quoted, schema-qualified name of the partition that begins at lo.
	Name func(lo time.Time) string
	// LockKey is the advisory lock of the table's steps.
	LockKey int64
}

// ValidEvery reports whether every can be a partitions' length: a whole number of minutes,
// from a minute to a day, that divides a day, so that the partitions of every day begin at
// the same times.
func ValidEvery(every time.Duration) bool {
	return every >= time.Minute && every <= 24*time.Hour && every%time.Minute == 0 && (24*time.Hour)%every == 0
}

// Partition is one partition of the table. A bound that is not a timestamp (MINVALUE,
// MAXVALUE; DEFAULT has neither) is nil.
type Partition struct {
	Name         string // quoted (regclass's text: qualified unless on search_path)
	Lower, Upper *time.Time
}

// layoutSQL reads how the table $1 is partitioned: whether it is a partitioned table,
// whether by range of column $2 alone, and whether it has a DEFAULT partition.
const layoutSQL = `
SELECT c.relkind = 'p',
       coalesce((SELECT pt.partstrat = 'r' AND pt.partnatts = 1 AND a.attname = $2
                 FROM pg_partitioned_table pt
                 JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
                 WHERE pt.partrelid = c.oid), false),
       coalesce((SELECT pt.partdefid <> 0 FROM pg_partitioned_table pt WHERE pt.partrelid = c.oid), false)
FROM pg_class c WHERE c.oid = to_regclass($1)`

// listSQL lists the partitions of the table $1 with their range, oldest first.
const listSQL = `
SELECT c.oid::regclass::text,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)
ORDER BY 3 NULLS FIRST`

// EndSQL reads where the last partition of the table $1 ends, of those whose upper bound is a
// timestamp (NULL when there are none), and the session's DateStyle, which must be ISO for
// the bounds to be read right: a caller checks it ([CheckDateStyle]).
const EndSQL = `
SELECT (SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass($1)),
       current_setting('DateStyle')`

// CheckDateStyle returns an error unless dateStyle, as [EndSQL] read it, is ISO.
func CheckDateStyle(dateStyle string) error {
	if len(dateStyle) < 3 || dateStyle[:3] != "ISO" {
		return fmt.Errorf("the partitions' bounds are read back from their text, which only DateStyle ISO (the server's default) writes unambiguously; this session's is %q", dateStyle)
	}
	return nil
}

// Querier runs a query.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Layout reads how the table is laid out: partitioned, by range of Column alone, with a
// DEFAULT partition.
func (t Table) Layout(ctx context.Context, db Querier) (partitioned, byColumn, withDefault bool, err error) {
	err = db.QueryRow(ctx, layoutSQL, t.Text, t.Column).Scan(&partitioned, &byColumn, &withDefault)
	return partitioned, byColumn, withDefault, err
}

// txStarter is a pool or a connection: what the steps run their own transactions on.
type txStarter interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Tx runs f in a step's transaction on db (see the package comment). When wait is false and
// another process holds the table's advisory lock, f does not run and done is false. A
// transaction given as db is refused: what a step locks and sets would last until it ends,
// holding the writers up meanwhile.
func (t Table) Tx(ctx context.Context, db any, wait bool, f func(tx pgx.Tx) error) (done bool, err error) {
	if wait {
		return t.step(ctx, db, waitLock, f)
	}
	return t.step(ctx, db, tryLock, f)
}

// How a step's transaction takes the table's advisory lock.
const (
	noLock   = iota // a read: no lock, other processes' steps go on
	tryLock         // if no other process holds it, else the step does not run
	waitLock        // waiting for it, for at most LockTimeout
)

// step is Tx, with the advisory lock taken as lock says.
func (t Table) step(ctx context.Context, db any, lock int, f func(tx pgx.Tx) error) (done bool, err error) {
	b, ok := db.(txStarter)
	if _, isTx := db.(pgx.Tx); isTx || !ok {
		return false, fmt.Errorf("a partitioned table's steps run transactions of their own: give a pool or a connection, not a %T", db)
	}
	err = pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true), set_config('DateStyle', 'ISO', true)",
			fmt.Sprintf("%dms", LockTimeout.Milliseconds())); err != nil {
			return err
		}
		switch lock {
		case noLock:
			done = true
		case waitLock:
			done = true
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", t.LockKey); err != nil {
				return err
			}
		default:
			if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", t.LockKey).Scan(&done); err != nil || !done {
				return err
			}
		}
		return f(tx)
	})
	return done, err
}

// List reads the database's clock and the table's partitions, in a step's transaction.
func (t Table) List(ctx context.Context, tx pgx.Tx) (now time.Time, parts []Partition, err error) {
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return now, nil, err
	}
	rows, err := tx.Query(ctx, listSQL, t.Text)
	if err != nil {
		return now, nil, err
	}
	parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (p Partition, err error) {
		return p, r.Scan(&p.Name, &p.Lower, &p.Upper)
	})
	return now, parts, err
}

// Missing returns the ranges to make so that partitions cover from the start of now's
// partition to now+ahead: the grid's ranges (multiples of every since the Unix epoch), cut
// where a partition already covers part of one. A nil bound is infinite.
func Missing(now time.Time, ahead, every time.Duration, parts []Partition) [][2]time.Time {
	var out [][2]time.Time
	end := now.Add(ahead)
	for t := now.Truncate(every); t.Before(end); {
		covered := false
		hi := t.Truncate(every).Add(every)
		for _, p := range parts {
			if p.Lower == nil && p.Upper == nil {
				continue // DEFAULT, which the libraries refuse
			}
			if (p.Lower == nil || !t.Before(*p.Lower)) && (p.Upper == nil || t.Before(*p.Upper)) {
				if p.Upper == nil {
					return out // up to MAXVALUE
				}
				t, covered = *p.Upper, true // t is in p: go on from its end
				break
			}
			if p.Lower != nil && p.Lower.After(t) && p.Lower.Before(hi) { // p begins inside t's range
				hi = *p.Lower
			}
		}
		if !covered {
			out = append(out, [2]time.Time{t, hi})
			t = hi
		}
	}
	return out
}

// Create makes the partitions missing from the start of the current one to ahead from now
// (see [Missing]), each in a step of its own, and returns how many it made. When wait is
// false, another process making them at the same time makes it do nothing.
func (t Table) Create(ctx context.Context, db any, ahead time.Duration, wait bool, log *slog.Logger) (made int, err error) {
	for {
		var more bool
		done, err := t.Tx(ctx, db, wait, func(tx pgx.Tx) error {
			now, parts, err := t.List(ctx, tx)
			if err != nil {
				return err
			}
			missing := Missing(now, ahead, t.Every, parts)
			if len(missing) == 0 {
				return nil
			}
			// One partition per transaction: the table's lock is held for one catalog change.
			r, name := missing[0], t.Name(missing[0][0])
			create := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
				name, t.Qualified, Timestamp(r[0]), Timestamp(r[1]))
			if _, err := tx.Exec(ctx, create); err != nil {
				return fmt.Errorf("make partition %s: %w", name, err)
			}
			log.InfoContext(ctx, t.Library+" partition made", slog.String("partition", name),
				slog.Time("from", r[0]), slog.Time("to", r[1]))
			made++
			more = len(missing) > 1
			return nil
		})
		if err != nil || !done || !more {
			return made, err
		}
	}
}

// Timestamp writes ts as a timestamptz literal's text.
func Timestamp(ts time.Time) string { return ts.UTC().Format("2006-01-02 15:04:05.999999Z07:00") }

// Drop drops the partitions whose range ended by cutoff, each in a step of its own, and
// returns how many rows they held (counted before the drop), and whether another process
// was at it, which leaves the rest to that process. keeps, when not empty, is a query of one boolean that
// tells whether the partition (%[1]s in it) must be kept, given $1, cutoff: it is asked
// first without the table's lock, then again under it. A partition whose bounds are not
// timestamps is never dropped. When the table's lock is not had in time, or another process
// is at it, the rest is left to the next run.
func (t Table) Drop(ctx context.Context, db any, cutoff time.Time, keeps string, log *slog.Logger) (retired int64, another bool, err error) {
	// Listed, looked at and counted without the advisory lock: a count reads every row of
	// a partition, and another process's step (Migrate's, waiting for the lock) should not
	// wait for it.
	var parts []Partition
	if _, err := t.step(ctx, db, noLock, func(tx pgx.Tx) (err error) {
		_, parts, err = t.List(ctx, tx)
		return err
	}); err != nil {
		return 0, false, fmt.Errorf("list partitions: %w", err)
	}
	kept := func(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
		if keeps == "" {
			return false, nil
		}
		var k bool
		err := tx.QueryRow(ctx, fmt.Sprintf(keeps, name), cutoff).Scan(&k)
		return k, err
	}
	for _, p := range parts {
		if p.Lower == nil || p.Upper == nil || p.Upper.After(cutoff) {
			continue
		}
		var keep, gone bool
		var rows int64
		// Looked at first without a lock: a partition kept for a while costs each run this
		// look, not a lock. Counted then, before the locks, to hold them only for the check
		// and the drop (a row that changes in between changes the count, not the check).
		_, err := t.step(ctx, db, noLock, func(tx pgx.Tx) (err error) {
			if keep, err = kept(ctx, tx, p.Name); err != nil || keep {
				return err
			}
			return tx.QueryRow(ctx, "SELECT count(*) FROM "+p.Name).Scan(&rows)
		})
		switch {
		case isUndefinedTable(err): // dropped by another process, or by hand, since it was listed
			continue
		case err != nil:
			return retired, false, fmt.Errorf("look at partition %s: %w", p.Name, err)
		case keep:
			log.DebugContext(ctx, t.Library+" partition kept past its retention", slog.String("partition", p.Name))
			continue
		}
		done, err := t.step(ctx, db, tryLock, func(tx pgx.Tx) (err error) {
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", p.Name).Scan(&gone); err != nil || gone {
				return err // dropped since it was looked at
			}
			// The table's lock (ONLY: not every partition's), as the drop takes it: a
			// writer that holds it and waits for the partition's lock would deadlock with a
			// lock on the partition taken first. Then the look again: a row may have come or
			// changed since.
			if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+t.Qualified+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			if keep, err = kept(ctx, tx, p.Name); err != nil || keep {
				return err
			}
			_, err = tx.Exec(ctx, "DROP TABLE "+p.Name)
			return err
		})
		switch {
		case isLockTimeout(err): // busy: a long transaction keeps the lock from every partition alike
			log.DebugContext(ctx, t.Library+" partition not dropped: its table is busy", slog.String("partition", p.Name))
			return retired, false, nil // the next run tries again
		case err != nil:
			return retired, false, fmt.Errorf("drop partition %s: %w", p.Name, err)
		case !done:
			return retired, true, nil // another process is at it
		case gone:
		case keep:
			log.DebugContext(ctx, t.Library+" partition kept past its retention", slog.String("partition", p.Name))
		default:
			retired += rows
			log.InfoContext(ctx, t.Library+" partition dropped", slog.String("partition", p.Name), slog.Int64("rows", rows))
		}
	}
	return retired, false, nil
}

// isLockTimeout tells whether err is PostgreSQL's lock_not_available.
func isLockTimeout(err error) bool { return isCode(err, "55P03") }

// isUndefinedTable tells whether err is PostgreSQL's undefined_table.
func isUndefinedTable(err error) bool { return isCode(err, "42P01") }

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

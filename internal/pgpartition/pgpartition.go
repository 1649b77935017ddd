// Package pgpartition keeps a table partitioned by range of a timestamp column: it makes the
// partitions ahead of time, on a grid, and drops whole the ones whose range ended long enough
// ago. The outbox keeps its table partitioned by created_at with it, the inbox its table by
// processed_at.
//
// Each step (make one partition, drop one) is a transaction of its own, at READ COMMITTED,
// that waits at most [LockTimeout] for each lock it takes, and that holds an advisory lock,
// keyed on the table's oid, serialising the steps of every process on the table. A partition is made apart and
// attached, under the table's SHARE UPDATE EXCLUSIVE lock, which writers do not conflict
// with. [Table.Drop] takes the table's ACCESS EXCLUSIVE lock, as DROP TABLE of a partition
// does, to look at the partition again under it: writers queue behind it for at most
// LockTimeout, and a drop that does not get it in time is left to the next run.
// [Table.DropConcurrently], for a table whose old partitions nothing keeps, detaches them
// CONCURRENTLY instead, which holds no writer up, on a connection of its own under a lock of
// its own. A partition not made is an error.
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LockTimeout bounds how long a step waits for each lock it takes, and so how long the
// writers queued behind it wait.
const LockTimeout = 200 * time.Millisecond

// DetachTimeout bounds how long DropConcurrently waits for the transactions on the table to
// end before a partition is detached; the writers do not wait meanwhile.
const DetachTimeout = time.Minute

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
	// Base is the table's own name, unquoted and unqualified: a partition's name is Base and
	// its Suffix, in the table's schema.
	Base string
}

// stepLockClass is the first key of the advisory lock that serialises a table's steps; the
// second is the table's oid, so that every process takes the same lock however it spells the
// table's name. It spells "part" in ASCII.
const stepLockClass = 0x70617274

// ValidEvery reports whether every can be a partitions' length: a whole number of minutes,
// from a minute to a day, that divides a day, so that the partitions of every day begin at
// the same times.
func ValidEvery(every time.Duration) bool {
	return every >= time.Minute && every <= 24*time.Hour && every%time.Minute == 0 && (24*time.Hour)%every == 0
}

// MinAhead is the least time ahead of now that [Table.Ahead] makes partitions for, whatever
// their length: an hour of the cleanup's outage costs the writers nothing.
const MinAhead = time.Hour

// Ahead is how far ahead of now partitions are made when a library's config asks for ahead:
// that, or when it is 0, three partitions and at least MinAhead.
func (t Table) Ahead(ahead time.Duration) time.Duration {
	if ahead > 0 {
		return ahead
	}
	return max(3*t.Every, MinAhead)
}

// Suffix is what the name of the partition that begins at lo adds to its table's: "_p" and
// lo in UTC, to the minute.
func Suffix(lo time.Time) string { return "_p" + lo.UTC().Format("200601021504") }

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

// CheckLayout returns an error unless the table is laid out as its library's Tables say:
// partitioned by range of Column alone, without a DEFAULT partition, when Every is set (a
// partition made for rows a DEFAULT partition holds would fail); a plain table when not.
// tables is the table's name as the library writes it in errors.
func (t Table) CheckLayout(ctx context.Context, db Querier, tables string) error {
	partitioned, byColumn, withDefault, err := t.Layout(ctx, db)
	switch {
	case err != nil:
		return fmt.Errorf("%s: read how %s is laid out: %w", t.Library, tables, err)
	case t.Every != 0 && !partitioned:
		return fmt.Errorf("%s: Tables.Partition is %s but %s is a plain table: it is not converted in place (README.md#partitioned-tables)", t.Library, t.Every, tables)
	case t.Every != 0 && !byColumn:
		return fmt.Errorf("%s: %s is partitioned, but not by range of %s alone", t.Library, tables, t.Column)
	case t.Every != 0 && withDefault:
		return fmt.Errorf("%s: %s has a DEFAULT partition: a partition made for rows it holds would fail; move its rows and drop it", t.Library, tables)
	case t.Every == 0 && partitioned:
		return fmt.Errorf("%s: %s is a partitioned table: set Tables.Partition to its partitions' length, in every process that uses it (README.md#partitioned-tables)", t.Library, tables)
	}
	return nil
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
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, coalesce(to_regclass($2)::oid::int4, 0))", stepLockClass, t.Text); err != nil {
				return err
			}
		default:
			if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1, coalesce(to_regclass($2)::oid::int4, 0))", stepLockClass, t.Text).Scan(&done); err != nil || !done {
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
			// One partition per transaction. Made apart, then attached: CREATE TABLE …
			// PARTITION OF would take the table's ACCESS EXCLUSIVE lock, which waits for every
			// transaction on the table to end (and holds new ones up meanwhile); ATTACH takes
			// SHARE UPDATE EXCLUSIVE, which writers do not conflict with. The attach makes
			// the table's indexes and triggers on the partition, and checks its range over
			// its rows: none.
			r := missing[0]
			var schema, comment, tablespace string
			if err := tx.QueryRow(ctx, parentSQL, t.Text, t.Library).Scan(&schema, &comment, &tablespace); err != nil {
				return fmt.Errorf("make a partition of %s: read the table: %w", t.Qualified, err)
			}
			// In the table's schema, the one DropConcurrently finishes drops in, whatever
			// search_path says.
			name := schema + "." + pgx.Identifier{t.Base + Suffix(r[0])}.Sanitize()
			for _, stmt := range []string{
				// What PARTITION OF takes from the table and an attach does not check: the
				// columns' storage and compression, and the tablespace. The attach checks the
				// rest: the columns, NOT NULL, CHECK constraints, generated columns.
				fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMPRESSION)%s",
					name, t.Qualified, tablespace),
				fmt.Sprintf("COMMENT ON TABLE %s IS %s", name, literal(comment)),
				fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
					t.Qualified, name, Timestamp(r[0]), Timestamp(r[1])),
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("make partition %s: %w", name, err)
				}
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

// commentSQL is the comment of the partitions the steps make for the table whose oid is c.oid,
// library $2 (text): what tells a partition detached by DropConcurrently, and not dropped,
// from any other table. It names the table as the catalog does, so that it is the same
// however a process spells it.
const commentSQL = `format('partition of %I.%I, made by the %s''s cleanup',
    (SELECT nspname FROM pg_namespace WHERE oid = c.relnamespace), c.relname, $2::text)`

// parentSQL reads, for the table $1 and library $2, its schema (quoted), the comment of the
// partitions the steps make and, when the table has a tablespace of its own, the clause that
// puts a partition in it.
const parentSQL = `SELECT (SELECT quote_ident(nspname) FROM pg_namespace WHERE oid = c.relnamespace),
    ` + commentSQL + `,
    coalesce((SELECT ' TABLESPACE ' || quote_ident(spcname) FROM pg_tablespace WHERE oid = c.reltablespace), '')
FROM pg_class c WHERE c.oid = to_regclass($1)`

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// CreateWaiting is Create for a process starting up, which must not go on before the
// partitions exist: it waits for another process making them, and when a lock is not had in
// time it tries again after backoff(n) (n from 1), up to attempts times.
func (t Table) CreateWaiting(ctx context.Context, db any, ahead time.Duration, attempts int, backoff func(int) time.Duration) error {
	for attempt := 1; ; attempt++ {
		_, err := t.Create(ctx, db, ahead, true, slog.New(slog.DiscardHandler))
		if !isLockTimeout(err) || attempt == attempts {
			return err
		}
		timer := time.NewTimer(backoff(attempt))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
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

// dropLockClass is the first key of the session-level advisory lock that serialises the
// concurrent drops of a table (DropConcurrently); the second is the table's oid. A key of its
// own: a drop waits up to DetachTimeout, and the steps that make partitions (Migrate's
// among them) must not wait for it. It spells "drop" in ASCII.
const dropLockClass = 0x64726f70

// pendingSQL lists, for the table $1 and library $2, its partitions whose DETACH …
// CONCURRENTLY was cut short, and the tables of its schema that a detach left behind, not
// dropped: both only those with the comment the steps give the partitions they make (or
// that DropConcurrently gives a partition before it detaches it). Names are qualified.
const pendingSQL = `
SELECT array(SELECT format('%I.%I', n.nspname, a.relname) FROM pg_inherits i
             JOIN pg_class a ON a.oid = i.inhrelid JOIN pg_namespace n ON n.oid = a.relnamespace
             WHERE i.inhparent = c.oid AND i.inhdetachpending
               AND obj_description(a.oid, 'pg_class') IS NOT DISTINCT FROM ` + commentSQL + `),
       array(SELECT format('%I.%I', n.nspname, a.relname) FROM pg_class a JOIN pg_namespace n ON n.oid = a.relnamespace
             WHERE a.relnamespace = c.relnamespace AND a.relkind = 'r' AND NOT a.relispartition
               AND obj_description(a.oid, 'pg_class') IS NOT DISTINCT FROM ` + commentSQL + `)
FROM pg_class c WHERE c.oid = to_regclass($1)`

// olderTransactionSQL counts the other client sessions of the database with a transaction
// open since before $1, and the sessions this role may not see (another role's, without
// pg_read_all_stats: their kind and their transaction's start read as NULL, even when
// idle): either may still write in a partition that ended at $1.
const olderTransactionSQL = `SELECT count(*) FILTER (WHERE backend_type = 'client backend' AND xact_start < $1),
       count(*) FILTER (WHERE query = '<insufficient privilege>')
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()`

// markSQL gives the partition $3 of the table $1 (library $2) the comment of the partitions
// the steps make, if it has another: one made by hand, then detached and not dropped, is
// found again by the next run.
const markSQL = `SELECT ` + commentSQL + `, obj_description(to_regclass($3), 'pg_class')
FROM pg_class c WHERE c.oid = to_regclass($1)`

// apartSQL tells whether the table $3 is one that a detach of the table $1 (library $2) left
// apart: not a partition, with the steps' comment.
const apartSQL = `SELECT coalesce((SELECT NOT a.relispartition
    AND obj_description(a.oid, 'pg_class') IS NOT DISTINCT FROM (SELECT ` + commentSQL + ` FROM pg_class c WHERE c.oid = to_regclass($1))
    FROM pg_class a WHERE a.oid = to_regclass($3)), false)`

// DropConcurrently drops the partitions whose range ended by cutoff, as Drop does, for a
// table whose old partitions no row keeps (nothing to look at again under a lock), without
// stopping its writers. It works on one connection of db (a pool or a connection), under a
// session-level advisory lock that another process's DropConcurrently skips, and for each
// partition, oldest first:
//
//   - it stops while a client transaction of the database that began before the partition's
//     range ended is open (it may still write in it, and a copy of what it writes, waiting
//     for it, would not see a detached partition's rows), or while a session's start is
//     hidden from the role (another role's, without pg_read_all_stats), logging a warning;
//   - it gives the partition the steps' comment, if it has another (one made by hand);
//   - it detaches it with DETACH PARTITION … CONCURRENTLY, which takes SHARE UPDATE
//     EXCLUSIVE and waits for the transactions that use the table to end (at most
//     DetachTimeout), rather than holding new ones up behind an ACCESS EXCLUSIVE lock;
//   - it counts the detached table's rows, and drops it.
//
// A detach cut short (by the timeout, ctx, a lost connection) leaves the partition pending,
// and one not dropped (the process died between the two) leaves a table apart: the next run
// finishes both first, those with the steps' comment only. A partition another hand left
// pending is an error: PostgreSQL detaches one partition of a table at a time. It returns how
// many rows the dropped partitions held.
func (t Table) DropConcurrently(ctx context.Context, db any, cutoff time.Time, log *slog.Logger) (retired int64, err error) {
	return t.dropConcurrently(ctx, db, cutoff, DetachTimeout, log)
}

// dropConcurrently is DropConcurrently, each wait at most wait.
func (t Table) dropConcurrently(ctx context.Context, db any, cutoff time.Time, wait time.Duration, log *slog.Logger) (retired int64, err error) {
	conn, release, err := sessionOf(ctx, db)
	if err != nil {
		return 0, err
	}
	broken := false
	defer func() { release(broken) }()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, coalesce(to_regclass($2)::oid::int4, 0))", dropLockClass, t.Text).Scan(&locked); err != nil {
		broken = true
		return 0, fmt.Errorf("lock the drops: %w", err)
	}
	if !locked {
		return 0, nil // another process drops
	}
	// The session's settings for the run, and its lock, undone before the connection goes
	// back; a connection that cannot undo them is closed instead.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := conn.Exec(ctx, "SELECT pg_advisory_unlock($1, coalesce(to_regclass($2)::oid::int4, 0))", dropLockClass, t.Text); uerr != nil {
			broken = true
		} else if _, uerr := conn.Exec(ctx, "RESET statement_timeout; RESET lock_timeout; RESET DateStyle"); uerr != nil {
			broken = true
		}
	}()
	timeout := fmt.Sprintf("%dms", wait.Milliseconds())
	if _, err := conn.Exec(ctx, "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $1, false), set_config('DateStyle', 'ISO', false)", timeout); err != nil {
		broken = true
		return 0, err
	}

	if err := t.finishDrops(ctx, conn, wait, log); err != nil {
		return 0, err
	}
	var parts []Partition
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
		_, parts, err = t.List(ctx, tx)
		return err
	}); err != nil {
		return 0, fmt.Errorf("list partitions: %w", err)
	}
	for _, p := range parts {
		if p.Lower == nil || p.Upper == nil || p.Upper.After(cutoff) {
			continue
		}
		var older, hidden int
		if err := conn.QueryRow(ctx, olderTransactionSQL, *p.Upper).Scan(&older, &hidden); err != nil {
			return retired, fmt.Errorf("look for transactions older than partition %s: %w", p.Name, err)
		}
		if older > 0 || hidden > 0 {
			// Bounds ascend: the later partitions wait for the same.
			log.WarnContext(ctx, t.Library+" partition kept past its retention: a transaction that began in its range may still write in it",
				slog.String("partition", p.Name), slog.Int("older_transactions", older), slog.Int("hidden_sessions", hidden))
			return retired, nil
		}
		var name string // qualified, as the catalog has it now
		if err := conn.QueryRow(ctx, "SELECT format('%I.%I', n.nspname, a.relname) FROM pg_class a JOIN pg_namespace n ON n.oid = a.relnamespace WHERE a.oid = to_regclass($1)", p.Name).Scan(&name); errors.Is(err, pgx.ErrNoRows) {
			continue // dropped by hand since it was listed
		} else if err != nil {
			return retired, fmt.Errorf("look at partition %s: %w", p.Name, err)
		}
		if err := t.mark(ctx, conn, name); err != nil {
			return retired, err
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", t.Qualified, name))
		switch {
		case isUndefinedTable(err): // detached or dropped by hand since it was listed
			continue
		case isCode(err, "55000"): // object_not_in_prerequisite_state: another detach is pending
			return retired, fmt.Errorf("detach partition %s: a partition of %s is being detached by hand; finish it (ALTER TABLE … DETACH PARTITION … FINALIZE): %w", name, t.Qualified, err)
		case isCode(err, "57014"): // query_canceled: the statement timeout
			return retired, fmt.Errorf("detach partition %s: a transaction on the table has lasted more than %s; the next run finishes the detach: %w", name, wait, err)
		case err != nil:
			return retired, fmt.Errorf("detach partition %s: %w", name, err)
		}
		var rows int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&rows); err != nil {
			return retired, fmt.Errorf("count the rows of partition %s: %w", name, err)
		}
		if err := t.dropApart(ctx, conn, name); err != nil {
			return retired, err
		}
		retired += rows
		log.InfoContext(ctx, t.Library+" partition dropped", slog.String("partition", name), slog.Int64("rows", rows))
	}
	return retired, nil
}

// sessionOf returns a connection of db of its own, and what gives it back: a broken one is
// closed rather than handed back to the pool.
func sessionOf(ctx context.Context, db any) (*pgx.Conn, func(broken bool), error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("acquire a connection: %w", err)
		}
		return c.Conn(), func(broken bool) {
			if broken {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer cancel()
				_ = c.Conn().Close(ctx) // the pool drops a closed connection
			}
			c.Release()
		}, nil
	case *pgx.Conn:
		return d, func(bool) {}, nil
	}
	return nil, nil, fmt.Errorf("a partitioned table's partitions are dropped on a connection of their own: give a pool or a connection, not a %T", db)
}

// finishDrops finishes what an earlier run left undone (see DropConcurrently): it detaches
// the partitions left detaching (FINALIZE, which waits for every older snapshot of the
// database, at most wait) and drops them, and drops the tables left apart.
func (t Table) finishDrops(ctx context.Context, conn *pgx.Conn, wait time.Duration, log *slog.Logger) error {
	var pending, apart []string
	if err := conn.QueryRow(ctx, pendingSQL, t.Text, t.Library).Scan(&pending, &apart); errors.Is(err, pgx.ErrNoRows) {
		return nil // no table: nothing left
	} else if err != nil {
		return fmt.Errorf("list partitions left detaching: %w", err)
	}
	for _, name := range pending {
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", t.Qualified, name))
		switch {
		case isUndefinedTable(err): // finished by hand
		case isCode(err, "57014"), isLockTimeout(err):
			return fmt.Errorf("finish detaching partition %s: a transaction older than the detach has lasted more than %s; the next run tries again: %w", name, wait, err)
		case err != nil:
			return fmt.Errorf("finish detaching partition %s: %w", name, err)
		}
		apart = append(apart, name)
	}
	for _, name := range apart {
		if err := t.dropApart(ctx, conn, name); err != nil {
			return err
		}
		log.InfoContext(ctx, t.Library+" partition left apart dropped", slog.String("partition", name))
	}
	return nil
}

// mark gives the partition name the steps' comment, if it has another.
func (t Table) mark(ctx context.Context, conn *pgx.Conn, name string) error {
	var want string
	var got *string
	if err := conn.QueryRow(ctx, markSQL, t.Text, t.Library, name).Scan(&want, &got); err != nil {
		return fmt.Errorf("read the comment of partition %s: %w", name, err)
	}
	if got != nil && *got == want {
		return nil
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("COMMENT ON TABLE %s IS %s", name, literal(want))); err != nil {
		return fmt.Errorf("mark partition %s: %w", name, err)
	}
	return nil
}

// dropApart drops the table name if a detach left it apart (not a partition, with the steps'
// comment), in a transaction that waits at most LockTimeout for its lock: no query plans to
// read it any more.
func (t Table) dropApart(ctx context.Context, conn *pgx.Conn, name string) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", LockTimeout.Milliseconds())); err != nil {
			return err
		}
		var apart bool
		if err := tx.QueryRow(ctx, apartSQL, t.Text, t.Library, name).Scan(&apart); err != nil || !apart {
			return err
		}
		_, err := tx.Exec(ctx, "DROP TABLE "+name)
		return err
	})
	if err != nil {
		return fmt.Errorf("drop partition %s: %w", name, err)
	}
	return nil
}

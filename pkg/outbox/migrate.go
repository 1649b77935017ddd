package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises concurrent migrations
// (several relays or API processes starting at once).
const migrationLock = 0x6f7574626f78 // "outbox"

// migrationLockTimeout bounds how long a migration waits for a table lock. A migration that
// has to change outbox_messages queues for its lock behind running transactions, and every
// writer queues behind the migration: PostgreSQL's lock queue is first come, first served.
// Giving up quickly and trying again keeps writers waiting at most this long.
const migrationLockTimeout = 2 * time.Second

// migrationAttempts is how often Migrate tries when a lock is not available in time.
const migrationAttempts = 10

// The version table, and what Migrate reads before anything else.
const (
	createVersionTable = `
CREATE TABLE IF NOT EXISTS outbox_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	// versionTableExists and currentVersion take no lock on outbox_messages, so the common
	// case — nothing to do — never waits for a relay.
	versionTableExists = `SELECT to_regclass('outbox_migrations') IS NOT NULL`
	currentVersion     = `SELECT coalesce(max(version), 0) FROM outbox_migrations`
	// legacyTable tells whether outbox_messages was created before the library recorded
	// versions (by version 1, unrecorded).
	legacyTable     = `SELECT to_regclass('outbox_messages') IS NOT NULL`
	recordVersion   = `INSERT INTO outbox_migrations (version) VALUES ($1)`
	setLockTimeout  = `SELECT set_config('lock_timeout', $1, true)`
	takeMigrateLock = `SELECT pg_advisory_xact_lock($1)`
)

// TxBeginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migration is one numbered file of migrations/.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads migrations/NNN_name.sql in version order.
func loadMigrations() ([]migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("list outbox migrations: %w", err)
	}
	slices.Sort(names)
	out := make([]migration, 0, len(names))
	for _, name := range names {
		prefix, _, _ := strings.Cut(path.Base(name), "_")
		v, err := strconv.Atoi(prefix)
		if err != nil || v != len(out)+1 {
			return nil, fmt.Errorf("outbox migration %s: want version %d as its prefix", name, len(out)+1)
		}
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		out = append(out, migration{version: v, name: path.Base(name), sql: string(sql)})
	}
	return out, nil
}

// Migrate brings the outbox schema to the version this package needs: the table, its
// indexes and its notify trigger. Versions are recorded in the outbox_migrations table, and
// each embedded migrations/NNN_*.sql file is applied once, in order, in one transaction.
//
// Migrate is safe on every start of every replica while relays and writers run at full load:
//
//   - When the schema is current (the common case) it reads the version table and returns:
//     it takes no lock on outbox_messages, so it never waits for a relay nor makes a writer
//     wait.
//   - Otherwise it serialises with other migrating processes (an advisory lock) and applies
//     what is missing with lock_timeout set, so that it never queues for long in front of
//     writers; when a lock is not available in time it rolls back and tries again with
//     backoff, up to ten times, then returns the error. Once it has a table's lock, writers
//     wait for what the migration does with it (version 2 rewrites the table: milliseconds
//     for a table that Cleanup keeps small).
//   - A table made by a version of this package that recorded no versions is taken to be at
//     version 1.
//
// Users who manage their schema with another tool apply migrations/*.sql in order instead,
// each once.
func Migrate(ctx context.Context, db TxBeginner) error {
	all, err := loadMigrations()
	if err != nil {
		return err
	}
	latest := all[len(all)-1].version
	for attempt := 1; ; attempt++ {
		err := migrateOnce(ctx, db, all, latest)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || attempt == migrationAttempts {
			return err
		}
		// lock_not_available: a long transaction holds the table. Let the writers queued
		// behind us through, and try again.
		t := time.NewTimer(backoff(attempt, 100*time.Millisecond, 2*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migrate outbox: %w (last attempt: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func migrateOnce(ctx context.Context, db TxBeginner, all []migration, latest int) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate outbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	version, err := readVersion(ctx, tx)
	if err != nil {
		return err
	}
	if version >= latest {
		return nil // current: nothing locked, nothing to commit
	}
	// lock_timeout first: it bounds the wait for the advisory lock too, behind another
	// process's migration that is itself waiting.
	if _, err := tx.Exec(ctx, setLockTimeout, strconv.Itoa(int(migrationLockTimeout.Milliseconds()))); err != nil {
		return fmt.Errorf("migrate outbox: set lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, takeMigrateLock, int64(migrationLock)); err != nil {
		return fmt.Errorf("migrate outbox: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, createVersionTable); err != nil {
		return fmt.Errorf("migrate outbox: create version table: %w", err)
	}
	// Read again under the lock: another process may have migrated meanwhile.
	applied, err := readVersion(ctx, tx)
	if err != nil {
		return err
	}
	if applied >= latest {
		return nil
	}
	if applied == 0 {
		var legacy bool
		if err := tx.QueryRow(ctx, legacyTable).Scan(&legacy); err != nil {
			return fmt.Errorf("migrate outbox: look for an unversioned table: %w", err)
		}
		if legacy {
			if _, err := tx.Exec(ctx, recordVersion, 1); err != nil {
				return fmt.Errorf("migrate outbox: record version 1 of an unversioned table: %w", err)
			}
			applied = 1
		}
	}
	for _, m := range all[applied:] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("apply outbox migration %s: %w", m.name, err)
		}
		if _, err := tx.Exec(ctx, recordVersion, m.version); err != nil {
			return fmt.Errorf("record outbox migration %s: %w", m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate outbox: commit: %w", err)
	}
	return nil
}

// readVersion returns the highest applied version, 0 when the version table is missing or
// empty.
func readVersion(ctx context.Context, tx pgx.Tx) (int, error) {
	var exists bool
	if err := tx.QueryRow(ctx, versionTableExists).Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrate outbox: look for the version table: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := tx.QueryRow(ctx, currentVersion).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrate outbox: read version: %w", err)
	}
	return v, nil
}

// Package pgmigrate applies versioned migrations to PostgreSQL ([Apply]): each version once,
// in order, in one transaction under an advisory lock, waiting at most [LockTimeout] for a
// lock and trying again when it has to, and taking no lock at all when the schema is
// current. It renders a library's migrations from text/template files for the library's
// table names ([ParseTemplates]), and describes a schema from PostgreSQL's catalog for tests
// ([Describe]).
//
// internal/pgmigrate is the source. pkg/outbox and pkg/inbox each keep a generated copy in
// their internal/pgmigrate, so that either library folder can be copied alone: edit the
// source and run go generate ./internal/pgmigrate; a test in tools fails when a copy differs
// from the source. The source also holds the services' part, which stays out of the copies:
// Service applies a service's numbered migrations/NNN_name.sql files with Apply, then the
// libraries' schemas.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TxBeginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migration is one version of a schema: the SQL that brings it from the previous version,
// and the SQL that takes it back.
type Migration struct {
	// Version is 1 for the first migration, and one more for each next one.
	Version int
	// Name is the migration's name without its version prefix, e.g. "outbox".
	Name string
	// Up and Down are the statements, several in one string.
	Up, Down string
}

// Config says what to migrate, and how to recognise what was done before.
type Config struct {
	// Library names what is migrated in errors, e.g. "outbox".
	Library string
	// Schema is the schema that holds the tables, unquoted; created when missing. Empty: the
	// tables are unqualified, and the connection's search_path decides.
	Schema string
	// VersionTable is the table versions are recorded in, quoted and schema-qualified as SQL
	// spells it; VersionTableText is the same name as text, for to_regclass.
	VersionTable, VersionTableText string
	// Table, as text for to_regclass, is a table every version has (the library's messages
	// table). A version table that records versions while Table is missing is refused: it
	// belongs to other tables too (their default names meet), or Table was dropped behind
	// its back, and its versions are not Table's.
	Table string
	// LegacyTable, as text for to_regclass, is a table made by version 1 before versions were
	// recorded: when it exists and VersionTable does not, the schema is at version 1. Empty:
	// no such table.
	LegacyTable string
	// LegacyVersion, when set, finds the version of a schema migrated before VersionTable
	// recorded it (by an earlier runner with a record of its own): it is called under the
	// advisory lock, in the migration's transaction, when VersionTable records no version,
	// and returns the version the schema is at (0: none). Versions 1 to that one are then
	// recorded without being applied. An error stops the migration. At most one of
	// LegacyTable and LegacyVersion is set.
	LegacyVersion func(ctx context.Context, tx pgx.Tx) (int, error)
	// LockKey is the pg_advisory_xact_lock key that serialises the processes migrating these
	// tables.
	LockKey int64
	// Backoff is the wait after the n-th attempt in a row that found a lock taken (n from
	// 1): the caller's own backoff (its internal/retry's Backoff.Delay), so that this
	// package, copied into each library, needs no backoff of its own. Required.
	Backoff func(n int) time.Duration
	// Migrations are the versions 1, 2, … in order.
	Migrations []Migration
}

// LockTimeout bounds how long a migration waits for a lock. A migration that has to change a
// table queues for its lock behind running transactions, and every writer queues behind the
// migration: PostgreSQL's lock queue is first come, first served. Giving up quickly and
// trying again keeps writers waiting at most this long.
const LockTimeout = 2 * time.Second

// Attempts is how often [Apply] tries when a lock is not available in time.
const Attempts = 10

// lockNotAvailable is the SQLSTATE of a lock not granted within lock_timeout;
// uniqueViolation, of a catalog row another transaction inserted first.
const (
	lockNotAvailable = "55P03"
	uniqueViolation  = "23505"
)

// errSchemaCreated: another process created the missing schema at the same time (the
// advisory lock only serialises the processes migrating the same tables; the other library,
// or tables of other names, may be creating the same schema).
var errSchemaCreated = errors.New("created concurrently")

// Statements of the runner; the version table's name is added where it is used.
const (
	// tableExists and currentVersion take no lock on the migrated tables, so the common case
	// — nothing to do — never waits for their users.
	tableExists     = `SELECT to_regclass($1) IS NOT NULL`
	currentVersion  = `SELECT coalesce(max(version), 0), to_regclass($1) IS NOT NULL FROM `
	schemaExists    = `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`
	setLockTimeout  = `SELECT set_config('lock_timeout', $1, true)`
	takeLock        = `SELECT pg_advisory_xact_lock($1)`
	recordVersion   = `INSERT INTO %s (version) VALUES ($1)`
	createVersionTB = `
CREATE TABLE IF NOT EXISTS %s (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
)

// Apply brings the schema to the last of c.Migrations:
//
//   - When the schema is current (the common case) it reads the version table and returns:
//     it takes no lock on the migrated tables, so it never waits for their users nor makes
//     them wait.
//   - Otherwise it sets lock_timeout, then takes the advisory lock (so the timeout bounds
//     the wait behind another process's migration too), creates the schema and the version
//     table when missing, reads the version again, and applies each missing version once, in
//     order, recording it, all in one transaction. When a lock is not available in time it
//     rolls back and tries again with backoff, up to [Attempts] times, then returns the
//     error.
//   - A c.LegacyTable that exists without a version table is taken to be at version 1; a
//     schema without recorded versions is at the version c.LegacyVersion returns.
func Apply(ctx context.Context, db TxBeginner, c Config) error {
	if len(c.Migrations) == 0 {
		return fmt.Errorf("migrate %s: no migrations", c.Library)
	}
	if c.Backoff == nil {
		return fmt.Errorf("migrate %s: no backoff", c.Library)
	}
	if c.Table == "" {
		return fmt.Errorf("migrate %s: no table to check the version table against", c.Library)
	}
	if c.LegacyTable != "" && c.LegacyVersion != nil {
		return fmt.Errorf("migrate %s: both LegacyTable and LegacyVersion are set", c.Library)
	}
	for i, m := range c.Migrations {
		if m.Version != i+1 {
			return fmt.Errorf("migrate %s: migration %s has version %d, want %d", c.Library, m.Name, m.Version, i+1)
		}
	}
	for attempt := 1; ; attempt++ {
		err := applyOnce(ctx, db, c)
		var pgErr *pgconn.PgError
		retry := errors.Is(err, errSchemaCreated) || errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable
		if err == nil || !retry || attempt == Attempts {
			return err
		}
		// lock_not_available: a long transaction holds the table. Let the writers queued
		// behind us through, and try again. Or the schema now exists: use it.
		t := time.NewTimer(c.Backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migrate %s: %w (last attempt: %w)", c.Library, ctx.Err(), err)
		case <-t.C:
		}
	}
}

func applyOnce(ctx context.Context, db TxBeginner, c Config) error {
	latest := len(c.Migrations)
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: begin: %w", c.Library, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	version, err := readVersion(ctx, tx, c)
	if err != nil {
		return err
	}
	if version >= latest {
		return nil // current: nothing locked, nothing to commit
	}
	if err := lock(ctx, tx, c); err != nil {
		return err
	}
	if err := createSchema(ctx, tx, c); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(createVersionTB, c.VersionTable)); err != nil {
		return fmt.Errorf("migrate %s: create version table: %w", c.Library, err)
	}
	// Read again under the lock: another process may have migrated meanwhile.
	applied, err := readVersion(ctx, tx, c)
	if err != nil {
		return err
	}
	if applied >= latest {
		return nil
	}
	record := fmt.Sprintf(recordVersion, c.VersionTable)
	if applied == 0 {
		if applied, err = recordLegacy(ctx, tx, c, record); err != nil {
			return err
		}
	}
	for _, m := range c.Migrations[applied:] {
		if _, err := tx.Exec(ctx, m.Up); err != nil {
			return fmt.Errorf("migrate %s: apply %03d_%s: %w", c.Library, m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, record, m.Version); err != nil {
			return fmt.Errorf("migrate %s: record %03d_%s: %w", c.Library, m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", c.Library, err)
	}
	return nil
}

// lock sets lock_timeout, then takes the advisory lock: the timeout bounds the wait for the
// advisory lock too, behind another process's migration that is itself waiting.
func lock(ctx context.Context, tx pgx.Tx, c Config) error {
	if _, err := tx.Exec(ctx, setLockTimeout, strconv.Itoa(int(LockTimeout.Milliseconds()))); err != nil {
		return fmt.Errorf("migrate %s: set lock_timeout: %w", c.Library, err)
	}
	if _, err := tx.Exec(ctx, takeLock, c.LockKey); err != nil {
		return fmt.Errorf("migrate %s: lock: %w", c.Library, err)
	}
	return nil
}

// createSchema creates c.Schema when it is missing. CREATE SCHEMA IF NOT EXISTS needs the
// CREATE privilege on the database even when the schema exists, so it only runs when the
// schema is missing; a schema another process created meanwhile is errSchemaCreated, which
// [Apply] retries.
func createSchema(ctx context.Context, tx pgx.Tx, c Config) error {
	if c.Schema == "" {
		return nil
	}
	var exists bool
	if err := tx.QueryRow(ctx, schemaExists, c.Schema).Scan(&exists); err != nil {
		return fmt.Errorf("migrate %s: look for schema %q: %w", c.Library, c.Schema, err)
	}
	if exists {
		return nil
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{c.Schema}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == uniqueViolation {
			err = fmt.Errorf("%w: %w", errSchemaCreated, err)
		}
		return fmt.Errorf("migrate %s: create schema %q: %w", c.Library, c.Schema, err)
	}
	return nil
}

// recordLegacy records the versions applied before versions were recorded, when nothing is
// recorded yet: version 1 when c.LegacyTable exists, or what c.LegacyVersion answers. It
// returns the version the schema is at.
func recordLegacy(ctx context.Context, tx pgx.Tx, c Config, record string) (int, error) {
	if c.LegacyTable != "" {
		var legacy bool
		if err := tx.QueryRow(ctx, tableExists, c.LegacyTable).Scan(&legacy); err != nil {
			return 0, fmt.Errorf("migrate %s: look for an unversioned table: %w", c.Library, err)
		}
		if !legacy {
			return 0, nil
		}
		if _, err := tx.Exec(ctx, record, 1); err != nil {
			return 0, fmt.Errorf("migrate %s: record version 1 of an unversioned table: %w", c.Library, err)
		}
		return 1, nil
	}
	if c.LegacyVersion == nil {
		return 0, nil
	}
	legacy, err := c.LegacyVersion(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("migrate %s: %w", c.Library, err)
	}
	if latest := len(c.Migrations); legacy < 0 || legacy > latest {
		return 0, fmt.Errorf("migrate %s: the schema is at version %d before versions were recorded, "+
			"but the migrations are versions 1 to %d", c.Library, legacy, latest)
	}
	for v := 1; v <= legacy; v++ {
		if _, err := tx.Exec(ctx, record, v); err != nil {
			return 0, fmt.Errorf("migrate %s: record version %d, applied before versions were recorded: %w", c.Library, v, err)
		}
	}
	return legacy, nil
}

// readVersion returns the highest applied version, 0 when the version table is missing or
// empty.
func readVersion(ctx context.Context, tx pgx.Tx, c Config) (int, error) {
	var exists bool
	if err := tx.QueryRow(ctx, tableExists, c.VersionTableText).Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrate %s: look for the version table: %w", c.Library, err)
	}
	if !exists {
		return 0, nil
	}
	var (
		v     int
		table bool
	)
	if err := tx.QueryRow(ctx, currentVersion+c.VersionTable, c.Table).Scan(&v, &table); err != nil {
		return 0, fmt.Errorf("migrate %s: read version: %w", c.Library, err)
	}
	if v > 0 && !table {
		return 0, fmt.Errorf("migrate %s: %s records version %d, but %s does not exist: the version table "+
			"belongs to other tables too, or the table was dropped; give these tables a version table of "+
			"their own (Tables.Migrations), or empty it", c.Library, c.VersionTableText, v, c.Table)
	}
	return v, nil
}

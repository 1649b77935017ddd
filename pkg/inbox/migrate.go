package inbox

import (
	"context"
	"embed"
	"fmt"
	"sync"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/pgmigrate"
)

//go:generate go test -run ^TestToolMigrations$ -update .

// migrationTemplates are the source of the schema: one text/template per version, rendered
// for a [Tables] by [Migrate] and [Store.Migrate], and for the default Tables into
// [Migrations] by go generate.
//
//go:embed migrations/templates/*.sql.tmpl
var migrationTemplates embed.FS

// Migrations holds the inbox schema of the default [Tables] for migration tools, generated
// from the templates [Migrate] applies, so that either way makes the same schema:
//
//   - migrations/goose/NNN_name.sql for goose (-- +goose Up and Down annotations);
//   - migrations/golang-migrate/NNN_name.up.sql and NNN_name.down.sql for golang-migrate.
//
// Give goose fs.Sub(Migrations, "migrations/goose") (goose.SetBaseFS, or goose.NewProvider),
// golang-migrate iofs.New(Migrations, "migrations/golang-migrate"), each with a version table
// of its own, since these versions are numbered on their own (goose.WithTableName(
// "inbox_goose_db_version"), the driver's MigrationsTable "inbox_schema_migrations"); or copy the
// files into your project's migrations, renumbered. The Down migrations drop what the Up ones
// made, rows included, and take the versions they undo out of [Migrate]'s version table
// (inbox_migrations) if there is one, so that Migrate, run afterwards, makes them again.
// Tables with other names than the defaults are made by [Store.Migrate].
//
// Earlier versions of this package had Migrations hold the plain SQL files Migrate applied
// (migrations/001_inbox.sql); its goose and golang-migrate files replace them, and the same
// schema's source is now the templates Migrate renders.
//
//go:embed migrations/goose migrations/golang-migrate
var Migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises concurrent migrations of the
// default tables (several replicas starting at once); other tables derive theirs with
// Tables.lockKey. It spells "inbox" in ASCII.
const migrationLock int64 = 0x696e626f78

// templates are migrationTemplates, parsed once.
var templates = sync.OnceValues(func() (*pgmigrate.Templates, error) {
	return pgmigrate.ParseTemplates(migrationTemplates, "migrations/templates")
})

// renderMigrations returns the migrations of t's tables, in version order.
func renderMigrations(t Tables) ([]pgmigrate.Migration, error) {
	tmpl, err := templates()
	if err != nil {
		return nil, fmt.Errorf("inbox migrations: %w", err)
	}
	t = t.WithDefaults()
	ms, err := tmpl.Render(t.sqlNames())
	if err != nil {
		return nil, fmt.Errorf("inbox migrations for %s: %w", t, err)
	}
	return ms, nil
}

// migrateConfig returns what migrating t's tables takes: t validated, its migrations
// rendered, its version table and lock key.
func migrateConfig(t Tables) (pgmigrate.Config, error) {
	if err := t.Validate(); err != nil {
		return pgmigrate.Config{}, err
	}
	ms, err := renderMigrations(t)
	if err != nil {
		return pgmigrate.Config{}, err
	}
	t = t.WithDefaults()
	n := t.sqlNames()
	return pgmigrate.Config{
		Library:          "inbox",
		Schema:           t.Schema,
		VersionTable:     n.Migrations,
		VersionTableText: n.MigrationsText,
		Table:            n.MessagesText,
		LegacyTable:      n.MessagesText,
		LockKey:          t.lockKey("migrate", migrationLock),
		Migrations:       ms,
	}, nil
}

// migrate brings t's tables to the version this package needs, creating t.Schema when it is
// set and missing. See [Migrate].
func migrate(ctx context.Context, db TxBeginner, t Tables) error {
	c, err := migrateConfig(t)
	if err != nil {
		return err
	}
	return pgmigrate.Apply(ctx, db, c)
}

// Migrate brings the inbox schema of the default [Tables] to the version this package needs:
// the table and its index. Versions are recorded in the inbox_migrations table, and each
// version is applied once, in order, in one transaction: the same migration runner, with the
// same guarantees, as the outbox's Migrate.
//
// Migrate is safe on every start of every replica while consumers run at full load:
//
//   - When the schema is current (the common case) it reads the version table and returns:
//     it takes no lock on inbox_messages, so it never waits for a consumer nor makes one
//     wait.
//   - Otherwise it serialises with other migrating processes (an advisory lock) and applies
//     what is missing with lock_timeout set, so that it never queues for long in front of
//     consumers; when a lock is not available in time it rolls back and tries again with
//     backoff, up to ten times, then returns the error.
//   - A table made by a version of this package that recorded no versions, or by a
//     migration tool from [Migrations], is taken to be at version 1; the versions after it
//     may be applied again.
//   - A version table that records versions while the inbox table is missing is an error,
//     not a current schema: it belongs to other tables too, or the table was dropped.
//
// Users who manage their schema with goose or golang-migrate apply [Migrations] instead.
func Migrate(ctx context.Context, db TxBeginner) error {
	return migrate(ctx, db, Tables{})
}

package inbox

import (
	"context"
	"embed"
	"fmt"
	"sync"
	"time"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

//go:generate go test -run ^TestToolMigrations$ -update .

// migrationTemplates are the source of the schema: one text/template per version, rendered
// for a [Tables] by [Migrate] and [Store.Migrate], and for the default Tables into
// [Migrations] by go generate.
//
//go:embed migrations/templates/*.sql.tmpl
var migrationTemplates embed.FS

// Migrations holds the schema [Migrate] makes for the default [Tables], for goose (folder
// migrations/goose) and golang-migrate (migrations/golang-migrate); give each tool a version
// table of its own. The Down migrations drop what the Up ones made, rows included, and
// Migrate's record of them, so that Migrate, run afterwards, makes them again. Tables of
// other names are made by [Store.Migrate].
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
		return nil, fmt.Errorf("parse migrations: %w", err)
	}
	t = t.WithDefaults()
	ms, err := tmpl.Render(t.sqlNames())
	if err != nil {
		return nil, fmt.Errorf("render migrations for %s: %w", t, err)
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
		Backoff:          retry.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}.Delay,
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
	if err := pgmigrate.Apply(ctx, db, c); err != nil {
		return err
	}
	s, err := NewStore(t)
	if err != nil {
		return err
	}
	if err := checkLayoutOn(ctx, db, s); err != nil || t.Partition == 0 {
		return err
	}
	// The partitions of the next hours, so that consumers can process before Cleanup first
	// runs, never returning before they are made. The locks are waited for as the
	// migrations' are.
	if err := s.partitioned().CreateWaiting(ctx, db, s.partitioned().Ahead(0), pgmigrate.Attempts, c.Backoff); err != nil {
		return fmt.Errorf("inbox: make partitions of %s: %w", s.tables, err)
	}
	return nil
}

// Migrate brings the inbox schema of the default [Tables] to the version this package needs.
// It applies each missing version once, in order, in one transaction, and records it in
// [Tables].Migrations. It is safe on every start of every replica while consumers run at full
// load: when the schema is current it takes no lock on the inbox table; otherwise it
// serialises with other migrating processes and applies what is missing with lock_timeout
// set, retrying with backoff up to ten times. A table made by an earlier version of this
// package, or by a tool from [Migrations], is taken to be at version 1. A version table that
// records versions while the inbox table is missing is an error.
func Migrate(ctx context.Context, db TxBeginner) error {
	return migrate(ctx, db, Tables{})
}

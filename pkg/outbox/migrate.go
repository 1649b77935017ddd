package outbox

import (
	"context"
	"embed"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
)

//go:generate go test -run ^TestToolMigrations$ -update .

// migrationTemplates are the source of the schema: one text/template per version, rendered
// for a [Tables] by [Migrate] and [Store.Migrate], and for the default Tables into
// [Migrations] by go generate.
//
//go:embed migrations/templates/*.sql.tmpl
var migrationTemplates embed.FS

// Migrations holds the outbox schema of the default [Tables] for goose (migrations/goose)
// and golang-migrate (migrations/golang-migrate), generated from the templates [Migrate]
// applies. Give each tool a version table of its own (README.md#the-schema).
//
//go:embed migrations/goose migrations/golang-migrate
var Migrations embed.FS

// Advisory lock keys of the default tables; other tables derive theirs with Tables.lockKey.
const (
	// migrationLock serialises concurrent migrations (several relays or API processes
	// starting at once).
	migrationLock int64 = 0x6f7574626f78 // "outbox"
	// notifyLock is the lock the notify trigger tries, so that one committing transaction
	// at a time notifies (see migrations/templates/001_outbox.sql.tmpl).
	notifyLock int64 = 8031453476610924398 // "outbox_n"
)

// TxBeginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// templates are migrationTemplates, parsed once.
var templates = sync.OnceValues(func() (*pgmigrate.Templates, error) {
	return pgmigrate.ParseTemplates(migrationTemplates, "migrations/templates")
})

// migrationNames are what the migration templates are rendered with: t's SQL names, and
// what the notify trigger needs.
type migrationNames struct {
	sqlNames
	// NotifyChannel is the channel the trigger notifies, [Tables.NotifyChannel].
	NotifyChannel string
	// NotifyLock is the advisory lock key the trigger tries.
	NotifyLock int64
}

// renderMigrations returns the migrations of t's tables, in version order.
func renderMigrations(t Tables) ([]pgmigrate.Migration, error) {
	tmpl, err := templates()
	if err != nil {
		return nil, fmt.Errorf("outbox migrations: %w", err)
	}
	t = t.WithDefaults()
	ms, err := tmpl.Render(migrationNames{
		sqlNames:      t.sqlNames(),
		NotifyChannel: t.NotifyChannel(),
		NotifyLock:    t.lockKey("notify", notifyLock),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox migrations for %s: %w", t, err)
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
		Library:          "outbox",
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
	// The partitions of the next hours, so that writers can write before Cleanup first
	// runs, never returning before they are made. The locks are waited for as the
	// migrations' are.
	if err := s.partitioned().CreateWaiting(ctx, db, s.partitioned().Ahead(0), pgmigrate.Attempts, c.Backoff); err != nil {
		return fmt.Errorf("outbox: make partitions of %s: %w", s.tables, err)
	}
	return nil
}

// checkLayoutOn runs s.checkLayout on db, in a transaction of its own when db cannot run
// queries itself.
func checkLayoutOn(ctx context.Context, db any, s *Store) error {
	if d, ok := db.(DBTX); ok {
		return s.checkLayout(ctx, d)
	}
	b, ok := db.(TxBeginner)
	if !ok {
		return fmt.Errorf("outbox: a %T can neither run queries nor begin a transaction", db)
	}
	return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return s.checkLayout(ctx, tx) })
}

// Migrate brings the outbox schema of the default [Tables] to the version this package
// needs, each missing version once, in order, in one transaction. It is safe on every start
// of every replica at full load (README.md#the-schema says how). A table that a migration
// tool or an older version made is taken to be at version 1.
func Migrate(ctx context.Context, db TxBeginner) error {
	return migrate(ctx, db, Tables{})
}

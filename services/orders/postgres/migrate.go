package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises the migrations of processes
// starting at the same time.
const migrationLock int64 = 0x6f7264657273 // "orders"

const (
	createMigrationsTable = `CREATE TABLE IF NOT EXISTS orders_schema_migrations (
    version    text        PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	selectAppliedMigrations = `SELECT version FROM orders_schema_migrations`
	insertAppliedMigration  = `INSERT INTO orders_schema_migrations (version) VALUES ($1)`
)

// Migrate applies the service's embedded migrations (migrations/NNN_name.sql) that were not
// applied yet, in name order, in one transaction under an advisory lock, recording each in
// orders_schema_migrations; then the outbox's and the inbox's schemas. Safe to call on every
// start, from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	slices.Sort(names)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLock); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if _, err := tx.Exec(ctx, createMigrationsTable); err != nil {
			return fmt.Errorf("create orders_schema_migrations: %w", err)
		}
		rows, err := tx.Query(ctx, selectAppliedMigrations)
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		for _, name := range names {
			version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
			if slices.Contains(applied, version) {
				continue
			}
			sql, err := migrations.ReadFile(name)
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return fmt.Errorf("apply %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, insertAppliedMigration, version); err != nil {
				return fmt.Errorf("record %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate orders schema: %w", err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate outbox schema: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate inbox schema: %w", err)
	}
	return nil
}

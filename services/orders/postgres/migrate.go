package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises the migrations of processes
// starting at the same time.
const migrationLock int64 = 0x6f7264657273 // "orders"

// Migrate applies the service's embedded migrations (migrations/NNN_name.sql) that were not
// applied yet, in name order, in one transaction under an advisory lock, recording each in
// orders_schema_migrations; then the outbox's and the inbox's schemas. Safe to call on every
// start, from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgmigrate.Apply(ctx, pool, migrations, "migrations", "orders_schema_migrations", migrationLock)
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

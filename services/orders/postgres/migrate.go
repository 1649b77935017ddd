package postgres

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises the migrations of processes
// starting at the same time.
const migrationLock int64 = 0x6f7264657273 // "orders"

// Migrate applies the service's embedded migrations (migrations/NNN_name.sql) that were not
// applied yet, in name order, in one transaction under an advisory lock, recording each in
// orders_schema_migrations; then the outbox's and the inbox's schemas (internal/pgmigrate
// Service). Safe to call on every start, from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgmigrate.Service(ctx, pool, "orders", migrations, migrationLock)
}

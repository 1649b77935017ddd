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

// Migrate applies the service's embedded migrations (migrations/NNN_name.sql, numbered
// without a gap; NNN is the version) that were not applied yet, in order, in one
// transaction under an advisory lock, recording their versions in orders_schema_version;
// then the outbox's and the inbox's schemas (internal/pgmigrate Service, with the libraries'
// runner: a bounded lock_timeout, retries, and no lock when the schema is current). A
// database migrated before recorded the applied files in orders_schema_migrations, which
// the first run takes over. Safe to call on every start, from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgmigrate.Service(ctx, pool, "orders", migrations, migrationLock)
}

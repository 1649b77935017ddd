// Package postgres is the warehouse's PostgreSQL adapter: the schema (embedded, numbered
// migrations) and the [Store], which serves the HTTP API and applies the orders' events
// inside the consumer's transaction ([Store.ApplyOrderCreated], [Store.ApplyOrderCancelled]:
// the reservation rules of [Reserve] and [Release], and the answer written through pkg/outbox
// in the same transaction). Connecting (and creating the database on first start) is
// internal/pgdb's, shared with the orders service.
//
// # Locking
//
// Every transaction that changes an order's reservation first takes a transaction-scoped
// advisory lock on the order id, so that an OrderCreated and an OrderCancelled of the same
// order never interleave (and their outbox rows are written in commit order). A reservation
// then takes each line's quantity with one conditional UPDATE (… WHERE available >=
// quantity, and the order has no reservation yet) per line, in SKU order, sent in the round
// trip of the order's lock and the reads of its reservation, each statement running once the
// one before it is done: the row lock a hot SKU's transactions queue for is taken by the
// statement that changes the row, and held through the commit as any row lock is; what
// follows is one more round trip, the reservation's rows with the answer's outbox row
// (outbox.QueueAdd). When a line is short, its lines are rolled back to a savepoint and the
// decision is taken again under SELECT … ORDER BY sku FOR UPDATE, which also reads the levels
// the rejection reports; a release locks the same way. Every transaction locks SKUs in the
// same order, so two of them never deadlock over stock rows (transactions of one inbox
// batch hold each other's locks longer: the consumer cuts a batch at a deadlock or a lock
// wait past its timeout), and stock never goes negative (the CHECK (available >= 0)
// constraint is the safety net).
package postgres

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises concurrent migrations of
// the warehouse schema ("whouse" in ASCII).
const migrationLock int64 = 0x77686f757365

// Migrate brings the database up to date: the warehouse's own migrations/NNN_name.sql
// (numbered without a gap; NNN is the version) that have not been applied yet, in order,
// inside one transaction under an advisory lock, so that processes starting at the same time
// apply each migration once (versions recorded in warehouse_schema_version; a database
// migrated before recorded the applied files in warehouse_schema_migrations, which the first
// run takes over); then the outbox and inbox tables (pkg/outbox and pkg/inbox), with
// internal/pgmigrate Service and the libraries' runner (a bounded lock_timeout, retries, and
// no lock when the schema is current).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgmigrate.Service(ctx, pool, "warehouse", migrations, migrationLock)
}

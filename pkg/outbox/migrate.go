package outbox

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises concurrent migrations
// (several relays or API processes starting at once).
const migrationLock = 0x6f7574626f78 // "outbox"

// TxBeginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or updates the outbox table, its indexes and its notify trigger. It applies
// the embedded migrations/*.sql files in name order inside one transaction; every statement is
// idempotent, so calling Migrate on every start is safe, also from several processes at once.
//
// Users who manage their schema with another tool copy migrations/*.sql instead.
func Migrate(ctx context.Context, db TxBeginner) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("list outbox migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate outbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
		return fmt.Errorf("migrate outbox: lock: %w", err)
	}
	for _, name := range names {
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("apply %s: %w", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate outbox: commit: %w", err)
	}
	return nil
}

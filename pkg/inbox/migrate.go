package inbox

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
)

// Migrations holds the inbox schema as numbered SQL files (migrations/001_inbox.sql, …).
// [Migrate] applies them; projects with their own migration tool copy the files instead.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// migrationLockKey is the pg_advisory_xact_lock key that serialises concurrent [Migrate]
// calls (several replicas starting at once). It spells "inbox" in ASCII.
const migrationLockKey int64 = 0x696e626f78

const migrationLockSQL = `SELECT pg_advisory_xact_lock($1)`

// Migrate creates or updates the inbox table and its index. It applies the embedded
// migrations/*.sql files in name order inside one transaction, after taking a transaction
// scoped advisory lock, so processes that start at the same time do not race each other.
// Every statement is idempotent (IF NOT EXISTS), so calling Migrate on every start is safe.
//
// The table is created in the first schema of the connection's search_path.
func Migrate(ctx context.Context, db TxBeginner) error {
	names, err := fs.Glob(Migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("inbox: list migrations: %w", err)
	}
	slices.Sort(names)

	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: migrate: begin: %w", err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, migrationLockSQL, migrationLockKey); err != nil {
		return fmt.Errorf("inbox: migrate: lock: %w", err)
	}
	for _, name := range names {
		sql, err := Migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("inbox: migrate: read %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("inbox: migrate: apply %s: %w", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: migrate: commit: %w", err)
	}
	return nil
}

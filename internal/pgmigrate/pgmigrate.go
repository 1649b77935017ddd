// Package pgmigrate applies a service's numbered .sql migrations, each once, and with
// [Service] the libraries' schemas after them.
package pgmigrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// Service brings the database of the service name up to date: its own migrations (the
// migrations/*.sql files of fsys, applied by [Apply] into name_schema_migrations under the
// advisory lock lockKey), then the outbox's and the inbox's schemas (outbox.Migrate,
// inbox.Migrate). Safe to call on every start, from several processes at once.
func Service(ctx context.Context, pool *pgxpool.Pool, name string, fsys fs.FS, lockKey int64) error {
	if err := Apply(ctx, pool, fsys, "migrations", name+"_schema_migrations", lockKey); err != nil {
		return fmt.Errorf("migrate %s schema: %w", name, err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate outbox schema: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate inbox schema: %w", err)
	}
	return nil
}

// TxBeginner starts a transaction; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply runs the *.sql files of dir in fsys that table does not list yet, in name order, in
// one transaction under pg_advisory_xact_lock(lockKey), recording each in table (created if
// missing). Several processes may start at once: the lock makes the others wait, and they
// then find nothing left to do. If the process dies midway, the transaction rolls back and
// the next start applies the same files again.
func Apply(ctx context.Context, db TxBeginner, fsys fs.FS, dir, table string, lockKey int64) error {
	names, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	slices.Sort(names)
	t := pgx.Identifier{table}.Sanitize()
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+t+
			" (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
			return fmt.Errorf("create %s: %w", table, err)
		}
		rows, err := tx.Query(ctx, "SELECT version FROM "+t)
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		for _, name := range names {
			version := strings.TrimSuffix(path.Base(name), ".sql")
			if slices.Contains(applied, version) {
				continue
			}
			sql, err := fs.ReadFile(fsys, name)
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return fmt.Errorf("apply %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+t+" (version) VALUES ($1)", version); err != nil {
				return fmt.Errorf("record %s: %w", name, err)
			}
		}
		return nil
	})
}

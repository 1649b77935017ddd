// Package postgres is the warehouse's PostgreSQL adapter: the schema (embedded, numbered
// migrations), the repository behind the HTTP API ([Repo]), and the reservation rules applied
// inside a consumer's transaction ([Reserve], [Release]).
//
// # Locking
//
// Every transaction that changes an order's reservation first takes a transaction-scoped
// advisory lock on the order id, so that an OrderCreated and an OrderCancelled of the same
// order never interleave (and their outbox rows are written in commit order). Stock rows are
// then locked with SELECT … ORDER BY sku FOR UPDATE: every transaction locks SKUs in the same
// order, so two reservations never deadlock, and stock never goes negative (the CHECK
// (available >= 0) constraint is the safety net).
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises concurrent migrations of
// the warehouse schema ("whouse" in ASCII).
const migrationLock int64 = 0x77686f757365

// Open returns a pool on databaseURL with at most maxConns connections (0: pgx's default),
// after checking that the database answers.
func Open(ctx context.Context, databaseURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database %s: %w", cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// EnsureDatabase creates the database named in databaseURL when it does not exist. It
// connects to the same server's "postgres" database to do so, and tolerates another process
// creating the database at the same time.
func EnsureDatabase(ctx context.Context, databaseURL string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	name := cfg.Database
	if name == "" || name == "postgres" {
		return nil
	}
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to the postgres database to create %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, selectDatabaseExistsSQL, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %q: %w", name, err)
	}
	if exists {
		return nil
	}
	// CREATE DATABASE takes no parameters; the name is quoted as an identifier.
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok &&
		(pgErr.Code == "42P04" || pgErr.Code == "23505") { // duplicate_database, or the race on pg_database's unique index
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// Migrate brings the database up to date: the outbox and inbox tables (pkg/outbox and
// pkg/inbox), then the warehouse's own migrations/*.sql that have not been applied yet, in
// name order, inside one transaction under an advisory lock, so that processes starting at
// the same time apply each migration once. Applied migrations are recorded in
// warehouse_schema_migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate outbox: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate inbox: %w", err)
	}
	err := pgmigrate.Apply(ctx, pool, migrations, "migrations", "warehouse_schema_migrations", migrationLock)
	if err != nil {
		return fmt.Errorf("migrate warehouse: %w", err)
	}
	return nil
}

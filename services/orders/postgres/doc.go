// Package postgres is the orders service's PostgreSQL adapter: connecting (and creating the
// database on first start), the embedded migrations, and the Store, which writes an order, its
// history, its idempotency key and its events (through pkg/outbox) in one transaction.
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig tunes Connect.
type PoolConfig struct {
	// MaxConns bounds the pool. Default 10.
	MaxConns int32
	// ConnectTimeout bounds one connection attempt. Default 5s.
	ConnectTimeout time.Duration
}

// Connect creates the database named in databaseURL when it does not exist yet (through the
// server's postgres database; a concurrent creator is tolerated), then opens a pool on it and
// pings it.
func Connect(ctx context.Context, databaseURL string, cfg PoolConfig) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pcfg.MaxConns = cmp.Or(cfg.MaxConns, 10)
	pcfg.ConnConfig.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, 5*time.Second)
	if err := ensureDatabase(ctx, pcfg.ConnConfig); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	return pool, nil
}

// ensureDatabase connects to cfg's database and, when the server says it does not exist,
// creates it from the server's postgres database.
func ensureDatabase(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to database %q: %w", cfg.Database, err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to the postgres database to create %q: %w", cfg.Database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a connection we are done with
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		// duplicate_database, or the unique index of pg_database when another process
		// created it at the same moment: either way it exists now.
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", cfg.Database, err)
	}
	return nil
}

// IsUnavailable reports whether err means the database could not be reached or went away
// (as opposed to refusing the statement): connection failures, timeouts (a context deadline,
// also while waiting for a pool connection), closed connections, a server shutting down, and a
// cancelled context. Callers answer those with 503 and a Retry-After.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08": // connection_exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdowns, cannot_connect_now
			return true
		case pgErr.Code == "53300": // too_many_connections
			return true
		case pgErr.Code == "57014": // query_canceled (statement_timeout)
			return true
		}
		return false
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return true
	case pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

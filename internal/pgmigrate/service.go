package pgmigrate

// This file is the services' part of the package and stays out of the libraries' copies
// (tools/copies.Sets skips it): it imports the libraries themselves.

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// lockBackoff spaces a service's attempts to migrate while a lock is taken: 100ms doubling to
// 2s, jittered, as the libraries' own migrations do.
var lockBackoff = retry.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}

// ServiceDir is the directory of a service's file system that holds its migrations.
const ServiceDir = "migrations"

// serviceName is what a service's name may be: it names the service's version tables, as
// text for to_regclass too, and its errors.
var serviceName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// Statements of the services' part.
const (
	// legacyVersions reads the record of the runner services had before Apply: one row per
	// applied file, its name without .sql.
	legacyVersions = `SELECT version FROM %s`
)

// Service brings the database of the service name up to date: its own migrations, then the
// outbox's and the inbox's schemas (outbox.Migrate, inbox.Migrate), and the outbox's
// publication for a WAL relay (outbox.Store.CreatePublication: with it, a service moves from
// the polling relay to the WAL relay by its setting alone). Safe to call on every start,
// from several processes at once.
//
// The service's migrations are the files migrations/NNN_name.sql of fsys, numbered 001,
// 002, … without a gap (a gap, a duplicate or a badly named file is an error): file NNN is
// version NNN. [Apply] applies them, each once and in order, under the advisory lock
// lockKey, recording the versions in name_schema_version. A service without migration files
// has no version table.
//
// Databases migrated before recorded the names of the applied files (without .sql) in
// name_schema_migrations (version text PRIMARY KEY). When name_schema_version does not
// exist yet and that table does, its rows are taken as the versions applied: they must be
// the names of the first files, in order (else an error names the first row that is not),
// and their versions are recorded in name_schema_version. name_schema_migrations is then
// left as it is, and no longer written.
func Service(ctx context.Context, pool *pgxpool.Pool, name string, fsys fs.FS, lockKey int64) error {
	if !serviceName.MatchString(name) {
		return fmt.Errorf("migrate service %q: a service's name is lower-case letters, digits and _", name)
	}
	ms, err := serviceMigrations(fsys)
	if err != nil {
		return fmt.Errorf("migrate %s schema: %w", name, err)
	}
	if len(ms) > 0 {
		if err := Apply(ctx, pool, serviceConfig(name, lockKey, ms)); err != nil {
			return err // "migrate <name> schema: …"
		}
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate outbox schema: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate inbox schema: %w", err)
	}
	store, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		return fmt.Errorf("outbox publication: %w", err)
	}
	// At any wal_level: the publication waits for a server at wal_level = logical.
	if err := store.CreatePublication(ctx, pool, ""); err != nil {
		return fmt.Errorf("outbox publication: %w", err)
	}
	return nil
}

// serviceConfig is what [Service] applies ms with for the service name: the version table
// name_schema_version, and the record of the runner before it, name_schema_migrations, as
// the LegacyVersion.
func serviceConfig(name string, lockKey int64, ms []Migration) Config {
	versions := name + "_schema_version"
	return Config{
		Library:          name + " schema",
		VersionTable:     pgx.Identifier{versions}.Sanitize(),
		VersionTableText: versions,
		// The version table is the service's own, named after it: no other tables record
		// their versions in it, so there is no other table to check it against.
		Table:         versions,
		LockKey:       lockKey,
		Backoff:       lockBackoff.Delay,
		Migrations:    ms,
		LegacyVersion: legacyVersion(name+"_schema_migrations", ms),
	}
}

// serviceMigrations reads the directory [ServiceDir] of fsys: files NNN_name.sql, numbered from 001
// without a gap, each a [Migration] of version NNN with no Down. Other files are ignored.
// No files: no migrations, and no error.
func serviceMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, path.Join(ServiceDir, "*.sql"))
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	slices.Sort(names)
	ms := make([]Migration, 0, len(names))
	for _, file := range names {
		want := len(ms) + 1
		prefix, name, _ := strings.Cut(strings.TrimSuffix(path.Base(file), ".sql"), "_")
		v, err := strconv.Atoi(prefix)
		if err != nil || v != want || len(prefix) != 3 || name == "" {
			return nil, fmt.Errorf("migration %s: want %03d_<name>.sql (migrations are numbered 001, 002, … without a gap)", file, want)
		}
		sql, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, Up: string(sql)})
	}
	return ms, nil
}

// legacyVersion returns a [Config].LegacyVersion that reads table, the record of the runner
// before Apply (the names of the applied files, without .sql, in no order), and returns how
// many of ms it records: its rows, sorted, must be the names of ms's first migrations.
func legacyVersion(table string, ms []Migration) func(ctx context.Context, tx pgx.Tx) (int, error) {
	return func(ctx context.Context, tx pgx.Tx) (int, error) {
		var exists bool
		if err := tx.QueryRow(ctx, tableExists, table).Scan(&exists); err != nil {
			return 0, fmt.Errorf("look for %s: %w", table, err)
		}
		if !exists {
			return 0, nil
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(legacyVersions, pgx.Identifier{table}.Sanitize()))
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", table, err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", table, err)
		}
		// The earlier runner applied the files in name order, so what it recorded is the
		// first files' names; anything else (a renamed or removed file, a row added by hand)
		// leaves the schema's version unknown.
		slices.Sort(applied)
		for i, version := range applied {
			if i >= len(ms) {
				return 0, fmt.Errorf("%s records %s, but there are only %d migrations", table, version, len(ms))
			}
			if want := fmt.Sprintf("%03d_%s", ms[i].Version, ms[i].Name); version != want {
				return 0, fmt.Errorf("%s records %q where %q (%s/%s.sql) belongs: "+
					"its rows must be the names, without .sql, of the first migration files, in order",
					table, version, want, ServiceDir, want)
			}
		}
		return len(applied), nil
	}
}

package tools_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// describeSQL is the catalog query the libraries' own tests compare schemas with: the source
// of the copy each keeps in its internal/pgmigrate (tools/copies).
const describeSQL = "../internal/pgmigrate/describe.sql"

// Version tables, left out when schemas are compared: each way records its versions in its
// own table. The tools get a table per library, as the libraries' READMEs advise, since the
// libraries number their versions on their own.
var versionTables = []string{
	"outbox_migrations", "outbox_goose_db_version", "outbox_schema_migrations",
	"inbox_migrations", "inbox_goose_db_version", "inbox_schema_migrations",
}

// TestMigrationToolsMakeMigratesSchema: for each library, the goose files of its Migrations
// applied by goose's Go library, and its golang-migrate files applied by golang-migrate's,
// each on a fresh database, make the schema its Migrate makes on a third: the same tables,
// columns (types, defaults, nullability), indexes, constraints, triggers, functions and
// comments, as PostgreSQL's catalog describes them. All the Down migrations then leave an
// empty schema, and the Up migrations again the same one. Migrate run afterwards on a
// database a tool made (which has no version table of Migrate's) takes it over unchanged;
// and a tool's Up run on a database Migrate made changes nothing either.
func TestMigrationToolsMakeMigratesSchema(t *testing.T) {
	t.Parallel()
	query, err := os.ReadFile(describeSQL)
	require.NoError(t, err)
	for _, lib := range []struct {
		name       string
		migrations fs.FS
		migrate    func(context.Context, *pgxpool.Pool) error
		versions   int
	}{
		{"outbox", outbox.Migrations, func(ctx context.Context, p *pgxpool.Pool) error { return outbox.Migrate(ctx, p) }, 3},
		{"inbox", inbox.Migrations, func(ctx context.Context, p *pgxpool.Pool) error { return inbox.Migrate(ctx, p) }, 1},
	} {
		t.Run(lib.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			describe := func(t *testing.T, dbURL string) []string {
				t.Helper()
				conn, err := pgx.Connect(ctx, dbURL)
				require.NoError(t, err)
				defer conn.Close(ctx)
				rows, err := conn.Query(ctx, string(query), "public", versionTables)
				require.NoError(t, err)
				lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				return lines
			}
			// migrateOver runs Migrate on a database a tool made: it records the versions
			// and changes nothing.
			migrateOver := func(t *testing.T, dbURL string, want []string) {
				t.Helper()
				pool, err := pgxpool.New(ctx, dbURL)
				require.NoError(t, err)
				defer pool.Close()
				require.NoError(t, lib.migrate(ctx, pool))
				require.Equal(t, want, describe(t, dbURL), "Migrate changed the schema a tool made")
				var n int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+lib.name+"_migrations").Scan(&n))
				require.Equal(t, lib.versions, n)
			}

			migrated := newDatabase(t)
			pool, err := pgxpool.New(ctx, migrated)
			require.NoError(t, err)
			require.NoError(t, lib.migrate(ctx, pool))
			pool.Close()
			want := describe(t, migrated)
			require.NotEmpty(t, want)

			t.Run("goose", func(t *testing.T) {
				t.Parallel()
				dbURL := newDatabase(t)
				files, err := fs.Sub(lib.migrations, "migrations/goose")
				require.NoError(t, err)
				p := newGoose(t, dbURL, lib.name, files)
				results, err := p.Up(ctx)
				require.NoError(t, err)
				require.Len(t, results, lib.versions)
				require.Equal(t, want, describe(t, dbURL), "goose made another schema than Migrate")

				_, err = p.DownTo(ctx, 0)
				require.NoError(t, err)
				require.Empty(t, describe(t, dbURL), "the Down migrations left objects behind")
				_, err = p.Up(ctx)
				require.NoError(t, err)
				require.Equal(t, want, describe(t, dbURL), "goose made another schema after down and up")

				migrateOver(t, dbURL, want)
				_, err = p.Up(ctx)
				require.NoError(t, err, "goose after Migrate")
			})

			t.Run("golang-migrate", func(t *testing.T) {
				t.Parallel()
				dbURL := newDatabase(t)
				m := newGolangMigrate(t, dbURL, lib.name, lib.migrations)
				require.NoError(t, m.Up())
				version, dirty, err := m.Version()
				require.NoError(t, err)
				require.False(t, dirty)
				require.EqualValues(t, lib.versions, version)
				require.Equal(t, want, describe(t, dbURL), "golang-migrate made another schema than Migrate")

				require.NoError(t, m.Down())
				require.Empty(t, describe(t, dbURL), "the Down migrations left objects behind")
				require.NoError(t, m.Up())
				require.Equal(t, want, describe(t, dbURL), "golang-migrate made another schema after down and up")

				migrateOver(t, dbURL, want)
				require.ErrorIs(t, m.Up(), migrate.ErrNoChange, "golang-migrate after Migrate")
			})

			// A tool taking over a database Migrate made: every Up migration finds its work
			// done, or does it again to the same effect.
			t.Run("ToolsAfterMigrate", func(t *testing.T) {
				t.Parallel()
				for _, tool := range []string{"goose", "golang-migrate"} {
					dbURL := newDatabase(t)
					pool, err := pgxpool.New(ctx, dbURL)
					require.NoError(t, err)
					require.NoError(t, lib.migrate(ctx, pool))
					pool.Close()
					if tool == "goose" {
						files, err := fs.Sub(lib.migrations, "migrations/goose")
						require.NoError(t, err)
						_, err = newGoose(t, dbURL, lib.name, files).Up(ctx)
						require.NoError(t, err)
					} else {
						require.NoError(t, newGolangMigrate(t, dbURL, lib.name, lib.migrations).Up())
					}
					require.Equal(t, want, describe(t, dbURL), "%s changed the schema Migrate made", tool)
				}
			})

			// Back to Migrate after a tool went down: the Down migrations take back what
			// they undo from Migrate's version table too, so that Migrate, on the next
			// start, makes the schema again instead of taking a stale record for it.
			t.Run("MigrateAfterToolDown", func(t *testing.T) {
				t.Parallel()
				for _, tool := range []string{"goose", "golang-migrate"} {
					for _, steps := range slices.Compact([]int{1, lib.versions}) {
						t.Run(fmt.Sprintf("%s/%d", tool, steps), func(t *testing.T) {
							dbURL := newDatabase(t)
							pool, err := pgxpool.New(ctx, dbURL)
							require.NoError(t, err)
							defer pool.Close()
							require.NoError(t, lib.migrate(ctx, pool))
							if tool == "goose" {
								files, err := fs.Sub(lib.migrations, "migrations/goose")
								require.NoError(t, err)
								p := newGoose(t, dbURL, lib.name, files)
								_, err = p.Up(ctx)
								require.NoError(t, err)
								_, err = p.DownTo(ctx, int64(lib.versions-steps))
								require.NoError(t, err)
							} else {
								m := newGolangMigrate(t, dbURL, lib.name, lib.migrations)
								require.NoError(t, m.Up())
								require.NoError(t, m.Steps(-steps))
							}
							require.NoError(t, lib.migrate(ctx, pool))
							require.Equal(t, want, describe(t, dbURL), "Migrate after %s went %d down", tool, steps)
						})
					}
				}
			})
		})
	}
}

// newGoose returns a goose provider of files on dbURL, recording versions in
// <lib>_goose_db_version; it is closed when the test ends.
func newGoose(t *testing.T, dbURL, lib string, files fs.FS) *goose.Provider {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, openDB(t, dbURL), files,
		goose.WithTableName(lib+"_goose_db_version"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// newGolangMigrate returns golang-migrate with the files of migrations/golang-migrate on
// dbURL, recording versions in <lib>_schema_migrations; it is closed when the test ends.
func newGolangMigrate(t *testing.T, dbURL, lib string, migrations fs.FS) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(migrations, "migrations/golang-migrate")
	require.NoError(t, err)
	driver, err := migratepgx.WithInstance(openDB(t, dbURL), &migratepgx.Config{MigrationsTable: lib + "_schema_migrations"})
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

// openDB opens a database/sql handle on dbURL through pgx, closed when the test ends.
func openDB(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newDatabase creates an empty database on the server OUTBOXSHOP_TEST_POSTGRES_URL names and
// returns its URL; the database is dropped when the test ends. Without the variable the test
// is skipped, or fails under CI=true.
func newDatabase(t *testing.T) string {
	t.Helper()
	admin := os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL")
	if admin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("OUTBOXSHOP_TEST_POSTGRES_URL is unset")
		}
		t.Skip("OUTBOXSHOP_TEST_POSTGRES_URL is unset")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "tools_schema_" + hex.EncodeToString(b)
	exec := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	require.NoError(t, exec("CREATE DATABASE "+name))
	t.Cleanup(func() {
		if err := exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

package pgmigrate_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

const lockKey = 42

// files are a service's migrations: 001 makes a table, 002 and 003 each add a row.
func files(names ...string) fstest.MapFS {
	all := map[string]string{
		"001_things.sql": "CREATE TABLE things (id int PRIMARY KEY);",
		"002_one.sql":    "INSERT INTO things VALUES (1);",
		"003_two.sql":    "INSERT INTO things VALUES (2);",
	}
	fsys := fstest.MapFS{"migrations/README.md": {Data: []byte("not a migration")}}
	for _, name := range names {
		fsys["migrations/"+name] = &fstest.MapFile{Data: []byte(all[name])}
	}
	return fsys
}

// bundle is a fresh database and what a test reads of it.
type bundle struct {
	url  string
	pool *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	url := testinfra.DatabaseURL(t)
	return &bundle{url: url, pool: newPool(t, url)}
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// versions returns what kit_schema_version records, in order.
func (b *bundle) versions(t *testing.T) []int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT version FROM kit_schema_version ORDER BY version")
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return vs
}

// things returns the rows of things, in order.
func (b *bundle) things(t *testing.T) []int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT id FROM things ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ids
}

func (b *bundle) exists(t *testing.T, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok))
	return ok
}

// migrateAsBefore does what the services' runner did before Service used Apply: apply the
// files in name order, recording each file's name without .sql in kit_schema_migrations.
func (b *bundle) migrateAsBefore(t *testing.T, names ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE TABLE kit_schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
	require.NoError(t, err)
	fsys := files(names...)
	for _, name := range names {
		_, err := b.pool.Exec(ctx, string(fsys["migrations/"+name].Data))
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, "INSERT INTO kit_schema_migrations (version) VALUES ($1)", name[:len(name)-len(".sql")])
		require.NoError(t, err)
	}
}

func TestService(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FreshDatabase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql"), lockKey))
		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql"), lockKey), "again: nothing to do")
		require.Equal(t, []int{1, 2}, b.versions(t))
		require.Equal(t, []int{1}, b.things(t), "each file applied once")
		require.False(t, b.exists(t, "kit_schema_migrations"), "the old record is not made")
		for _, table := range []string{"outbox_messages", "inbox_messages"} {
			require.True(t, b.exists(t, table), "%s created", table)
		}

		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql", "003_two.sql"), lockKey))
		require.Equal(t, []int{1, 2, 3}, b.versions(t))
		require.Equal(t, []int{1, 2}, b.things(t), "a new file applied, the others not again")
	})

	t.Run("NoMigrations", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", fstest.MapFS{}, lockKey))
		require.False(t, b.exists(t, "kit_schema_version"))
		require.True(t, b.exists(t, "outbox_messages"), "the libraries' schemas all the same")
	})

	// A database the runner before migrated: its record is taken over, and only the files
	// it did not apply are applied.
	t.Run("MigratedBefore", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name   string
			before []string
		}{
			{"Some", []string{"001_things.sql", "002_one.sql"}},
			{"All", []string{"001_things.sql", "002_one.sql", "003_two.sql"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.migrateAsBefore(t, tc.before...)
				require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql", "003_two.sql"), lockKey))
				require.Equal(t, []int{1, 2, 3}, b.versions(t))
				require.Equal(t, []int{1, 2}, b.things(t), "no file applied twice")
				require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql", "003_two.sql"), lockKey))
				require.Equal(t, []int{1, 2, 3}, b.versions(t))
			})
		}
	})

	// The old record must be the first files' names, in order: otherwise which files were
	// applied is not known, and nothing is done.
	t.Run("MigratedBeforeUnknownRecord", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name, row, err string
		}{
			{"Renamed", "002_uno", `kit_schema_migrations records "002_uno" where "002_one" (migrations/002_one.sql) belongs`},
			{"Gap", "003_two", `kit_schema_migrations records "003_two" where "002_one"`},
			{"Unknown", "004_four", `kit_schema_migrations records "004_four" where "002_one"`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.migrateAsBefore(t, "001_things.sql")
				_, err := b.pool.Exec(ctx, "INSERT INTO kit_schema_migrations (version) VALUES ($1)", tc.row)
				require.NoError(t, err)
				err = pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql", "002_one.sql", "003_two.sql"), lockKey)
				require.ErrorContains(t, err, "migrate kit schema: "+tc.err)
				require.False(t, b.exists(t, "kit_schema_version"), "rolled back")
				require.Empty(t, b.things(t))
			})
		}
		t.Run("MoreThanTheFiles", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.migrateAsBefore(t, "001_things.sql", "002_one.sql")
			err := pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql"), lockKey)
			require.ErrorContains(t, err, "kit_schema_migrations records 002_one, but there are only 1 migrations")
		})
	})

	// Processes starting at once, each with its own connections: each file is applied once,
	// on a fresh database and on one the runner before migrated.
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name   string
			before []string
		}{{"Fresh", nil}, {"MigratedBefore", []string{"001_things.sql"}}} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				if tc.before != nil {
					b.migrateAsBefore(t, tc.before...)
				}
				fsys := files("001_things.sql", "002_one.sql", "003_two.sql")
				// The first file takes a while, so that the others queue for the lock.
				fsys["migrations/001_things.sql"].Data = append(fsys["migrations/001_things.sql"].Data, " SELECT pg_sleep(0.2);"...)
				pools := []*pgxpool.Pool{b.pool, newPool(t, b.url)}
				start := make(chan struct{})
				errs := make([]error, 4)
				var wg sync.WaitGroup
				for i := range errs {
					wg.Go(func() {
						<-start
						errs[i] = pgmigrate.Service(ctx, pools[i%len(pools)], "kit", fsys, lockKey)
					})
				}
				close(start)
				wg.Wait()
				for _, err := range errs {
					require.NoError(t, err)
				}
				require.Equal(t, []int{1, 2, 3}, b.versions(t))
				require.Equal(t, []int{1, 2}, b.things(t))
			})
		}
	})

	t.Run("RefusesBadFiles", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			files []string
			err   string
		}{
			{"Gap", []string{"001_a.sql", "003_c.sql"}, "migration migrations/003_c.sql: want 002_<name>.sql"},
			{"NotFromOne", []string{"002_b.sql"}, "migration migrations/002_b.sql: want 001_<name>.sql"},
			{"Twice", []string{"001_a.sql", "001_b.sql"}, "migration migrations/001_b.sql: want 002_<name>.sql"},
			{"NoName", []string{"001.sql"}, "migration migrations/001.sql: want 001_<name>.sql"},
			{"TwoDigits", []string{"01_a.sql"}, "migration migrations/01_a.sql: want 001_<name>.sql"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				fsys := fstest.MapFS{}
				for _, name := range tc.files {
					fsys["migrations/"+name] = &fstest.MapFile{Data: []byte("SELECT 1;")}
				}
				err := pgmigrate.Service(ctx, b.pool, "kit", fsys, lockKey)
				require.ErrorContains(t, err, "migrate kit schema: "+tc.err)
				require.False(t, b.exists(t, "kit_schema_version"), "nothing applied")
				require.False(t, b.exists(t, "outbox_messages"), "nothing applied")
			})
		}
	})

	t.Run("RefusesBadName", func(t *testing.T) {
		t.Parallel()
		err := pgmigrate.Service(ctx, nil, `Kit"; --`, files("001_things.sql"), lockKey)
		require.ErrorContains(t, err, "a service's name is lower-case letters, digits and _")
	})

	// When the service is current, migrating takes no lock: it returns while another
	// transaction holds the migration lock and the service's table exclusively.
	t.Run("CurrentTakesNoLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fsys := files("001_things.sql", "002_one.sql")
		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", fsys, lockKey))
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // test
		_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lockKey))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE things IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		quick, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, pgmigrate.Service(quick, b.pool, "kit", fsys, lockKey))
	})

	// A migration that needs a table a long transaction holds waits at most
	// pgmigrate.LockTimeout at a time, so the writers queued behind it get through; it tries
	// again until the table is free.
	t.Run("LockTimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, pgmigrate.Service(ctx, b.pool, "kit", files("001_things.sql"), lockKey))
		reader, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer reader.Rollback(ctx) //nolint:errcheck // test
		_, err = reader.Exec(ctx, "SELECT count(*) FROM things")
		require.NoError(t, err)

		fsys := files("001_things.sql")
		fsys["migrations/002_column.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE things ADD COLUMN n int;")}
		done := make(chan error, 1)
		go func() { done <- pgmigrate.Service(ctx, b.pool, "kit", fsys, lockKey) }()

		testinfra.Eventually(t, 10*time.Second, func() bool {
			var waiting bool
			err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
				WHERE relation = 'things'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted)`).Scan(&waiting)
			return err == nil && waiting
		}, "the migration queues for the table")
		write, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = b.pool.Exec(write, "INSERT INTO things VALUES (7)")
		require.NoError(t, err, "a writer queued behind the migration gets through")
		select {
		case err := <-done:
			t.Fatalf("the migration returned while the table was held: %v", err)
		default:
		}

		require.NoError(t, reader.Rollback(ctx))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the migration did not finish once the table was free")
		}
		require.Equal(t, []int{1, 2}, b.versions(t))
	})
}

package inbox

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// describe returns schema's description from the catalog.
func describe(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	lines, err := pgmigrate.Describe(t.Context(), pool, schema)
	require.NoError(t, err)
	require.NotEmpty(t, lines, "schema %s is empty", schema)
	return lines
}

// versions returns what the version table of t records.
func versions(t *testing.T, pool *pgxpool.Pool, tables Tables) []int {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT version FROM "+tables.sqlNames().Migrations+" ORDER BY version")
	require.NoError(t, err)
	v, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return v
}

// TestMigrateTables: migrate renders the template for any Tables; for the default ones it
// makes exactly the schema earlier versions of this package made, and takes their databases
// over.
func TestMigrateTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	fresh := testinfra.NewPool(t)
	require.NoError(t, Migrate(ctx, fresh))
	want := describe(t, fresh, "public")
	require.Equal(t, []int{1}, versions(t, fresh, Tables{}))

	// A database made by the previous Migrate, which recorded no versions: the file of
	// testdata/legacy, applied on every start. It is at version 1; its rows stay.
	t.Run("PreviousMigrate", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		sql, err := os.ReadFile("testdata/legacy/001_inbox.sql")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(sql))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, message_type, received_at) VALUES ('c', 'm', '', now())`)
		require.NoError(t, err)
		require.Equal(t, filter(want, "inbox_migrations", false), describe(t, pool, "public"),
			"the template makes another schema than the previous file")
		require.NoError(t, Migrate(ctx, pool))
		require.Equal(t, want, describe(t, pool, "public"))
		require.Equal(t, []int{1}, versions(t, pool, Tables{}))
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM inbox_messages").Scan(&n))
		require.Equal(t, 1, n)
	})

	// Another schema, another name, names that need quoting, and the default tables beside
	// them: each inbox has its own table, version table, index and constraints, and the same
	// schema as the default one under its names.
	t.Run("OtherNames", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, Migrate(ctx, pool))
		others := []Tables{
			{Schema: "billing"},
			{Messages: "payments_messages"},
			{Schema: `Tenant "A"`, Messages: `Pay'ments`},
		}
		for _, tables := range others {
			require.NoError(t, migrate(ctx, pool, tables))
			require.NoError(t, migrate(ctx, pool, tables), "again")
		}
		require.Equal(t, want, filter(describe(t, pool, "public"), "payments", false), "the default tables changed")
		for _, tables := range others {
			t.Run(tables.String(), func(t *testing.T) {
				require.Equal(t, []int{1}, versions(t, pool, tables))
				insert := "INSERT INTO " + tables.String() + " (consumer, message_id, message_type, received_at) VALUES ('c', $1, '', now())"
				_, err := pool.Exec(ctx, insert, "m")
				require.NoError(t, err)
				_, err = pool.Exec(ctx, insert, "")
				require.ErrorContains(t, err, tables.WithDefaults().Messages+"_message_id_not_empty")
			})
		}

		got := describe(t, pool, "billing")
		require.Equal(t, want, rename(got, strings.NewReplacer("billing.", "public.")), "schema billing")
		got = filter(describe(t, pool, "public"), "payments", true)
		require.Equal(t, want, rename(got, strings.NewReplacer(
			"payments_messages", "inbox_messages",
			"payments_migrations", "inbox_migrations",
		)), "table payments_messages")
	})

	// Processes starting at once, for two tables of one missing schema: those of one table
	// wait for one another (its advisory lock), and the two tables' race to create the
	// schema is settled by trying again.
	t.Run("ConcurrentIntoAMissingSchema", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		tables := []Tables{{Schema: "tenant_1"}, {Schema: "tenant_1", Messages: "other_messages"}}
		errs := make(chan error, 8)
		for i := range cap(errs) {
			go func() { errs <- migrate(ctx, pool, tables[i%2]) }()
		}
		for range cap(errs) {
			require.NoError(t, <-errs)
		}
		for _, tables := range tables {
			require.Equal(t, []int{1}, versions(t, pool, tables))
		}
	})

	// When the schema is current, migrating takes no lock on the table: it returns while
	// another transaction holds the table exclusively.
	t.Run("CurrentTakesNoLock", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		require.NoError(t, Migrate(ctx, pool))
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // test
		_, err = tx.Exec(ctx, "LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		quick, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, Migrate(quick, pool))
	})

	// Two sets of tables whose version tables have one name ("orders" and "orders_messages"
	// both default to orders_migrations; "inbox" to the default tables' inbox_migrations):
	// the second must not take the first's versions for its own and leave its table unmade.
	t.Run("SharedVersionTable", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		for _, pair := range [][2]Tables{
			{{Messages: "orders"}, {Messages: "orders_messages"}},
			{{}, {Messages: "inbox"}},
		} {
			first, second := pair[0], pair[1]
			require.Equal(t, first.WithDefaults().Migrations, second.WithDefaults().Migrations)
			require.NoError(t, migrate(ctx, pool, first))
			err := migrate(ctx, pool, second)
			require.ErrorContains(t, err, "Tables.Migrations", "%s after %s", second, first)
			second.Migrations = second.WithDefaults().Messages + "_versions"
			require.NoError(t, migrate(ctx, pool, second), "with a version table of its own")
			require.Equal(t, []int{1}, versions(t, pool, second))
		}
	})

	t.Run("InvalidTables", func(t *testing.T) {
		t.Parallel()
		err := migrate(ctx, nil, Tables{Messages: strings.Repeat("x", MaxTableBytes+1)})
		require.ErrorIs(t, err, ErrInvalidTables)
	})
}

// filter returns the lines that contain s (keep) or those that do not (!keep).
func filter(lines []string, s string, keep bool) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, s) == keep {
			out = append(out, l)
		}
	}
	return out
}

// rename returns lines rewritten by r, sorted again.
func rename(lines []string, r *strings.Replacer) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = r.Replace(l)
	}
	slices.Sort(out)
	return out
}

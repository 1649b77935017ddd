package outbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// applyLegacy runs the SQL files of earlier versions of this package (testdata/legacy), the
// first n of them, as a migration tool would: without recording versions.
func applyLegacy(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	files, err := filepath.Glob("testdata/legacy/*.sql")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), n)
	for _, f := range files[:n] {
		sql, err := os.ReadFile(f)
		require.NoError(t, err)
		_, err = pool.Exec(t.Context(), string(sql))
		require.NoError(t, err, f)
	}
}

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

// TestMigrateTables: migrate renders the templates for any Tables; for the default ones it
// makes exactly the schema earlier versions of this package made, and takes their databases
// over.
func TestMigrateTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	fresh := testinfra.NewPool(t)
	require.NoError(t, Migrate(ctx, fresh))
	want := describe(t, fresh, "public")
	require.Equal(t, []int{1, 2, 3}, versions(t, fresh, Tables{}))

	// A database made by the previous Migrate: the same files, recorded as versions 1 and 2
	// in the same version table.
	t.Run("PreviousMigrate", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		applyLegacy(t, pool, 2)
		_, err := pool.Exec(ctx, `CREATE TABLE outbox_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
			INSERT INTO outbox_migrations (version) VALUES (1), (2)`)
		require.NoError(t, err)
		require.Equal(t, filter(want, "_handed", false), describe(t, pool, "public"),
			"the templates make another schema than the previous files (but for version 3's index)")
		require.NoError(t, Migrate(ctx, pool))
		require.Equal(t, want, describe(t, pool, "public"))
		require.Equal(t, []int{1, 2, 3}, versions(t, pool, Tables{}))
	})

	// A table made by a version that recorded no versions (only 001 existed).
	t.Run("Unversioned", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		applyLegacy(t, pool, 1)
		require.NoError(t, Migrate(ctx, pool))
		require.Equal(t, want, describe(t, pool, "public"))
		require.Equal(t, []int{1, 2, 3}, versions(t, pool, Tables{}))
	})

	// Another schema, another name, names that need quoting, and the default tables beside
	// them: each outbox has its own table, version table, indexes, trigger, function, lock
	// key and channel, and the same schema as the default one under its names.
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
				require.Equal(t, []int{1, 2, 3}, versions(t, pool, tables))
				requireNotifies(t, pool, tables)
			})
		}

		got := describe(t, pool, "billing")
		require.Equal(t, want, rename(got, strings.NewReplacer(
			"'billing.outbox_messages'", "'outbox_messages'",
			strconv.FormatInt(Tables{Schema: "billing"}.lockKey("notify", notifyLock), 10), strconv.FormatInt(notifyLock, 10),
			"EXECUTE FUNCTION billing.", "EXECUTE FUNCTION ", // visible through search_path in public
			"billing.", "public.",
		)), "schema billing")
		got = filter(describe(t, pool, "public"), "payments", true)
		require.Equal(t, want, rename(got, strings.NewReplacer(
			strconv.FormatInt(Tables{Messages: "payments_messages"}.lockKey("notify", notifyLock), 10), strconv.FormatInt(notifyLock, 10),
			"payments_messages", "outbox_messages",
			"payments_migrations", "outbox_migrations",
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
			require.Equal(t, []int{1, 2, 3}, versions(t, pool, tables))
		}
	})

	// When the schema is current, migrating takes no lock on the table: it returns while
	// another transaction holds the table exclusively.
	t.Run("CurrentTakesNoLock", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		tables := Tables{Schema: "s", Messages: "m"}
		require.NoError(t, migrate(ctx, pool, tables))
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // test
		_, err = tx.Exec(ctx, "LOCK TABLE "+tables.String()+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		quick, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, migrate(quick, pool, tables))
	})

	// Every Tables that Validate accepts is one migrate can make, and whose trigger notifies:
	// names at the byte limits in multi-byte characters, quotes, dots, dollars.
	t.Run("WhatValidateAccepts", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		e40 := strings.Repeat("é", MaxTableBytes/2) // 40 bytes, 20 runes
		s63 := strings.Repeat("ü", 31) + "s"        // 63 bytes
		for _, tables := range []Tables{
			{Messages: "a$$b"},
			{Schema: "s$$", Messages: "m"},
			{Schema: "s$", Messages: "$m"},
			{Messages: `"; DROP TABLE x; --`},
			{Schema: "a.b", Messages: "c.d"},
			{Messages: e40},
			{Schema: s63, Messages: e40},
			{Schema: s63, Messages: e40 + "x"}, // too long: refused
			{Messages: "m", Migrations: strings.Repeat("€", 21)},
		} {
			t.Run(fmt.Sprintf("%q.%q", tables.Schema, tables.Messages), func(t *testing.T) {
				if tables.Validate() != nil {
					return
				}
				require.NoError(t, migrate(ctx, pool, tables))
				require.NoError(t, migrate(ctx, pool, tables), "again")
				require.Equal(t, []int{1, 2, 3}, versions(t, pool, tables))
				requireNotifies(t, pool, tables)
			})
		}
	})

	// Two sets of tables whose version tables have one name ("orders" and "orders_messages"
	// both default to orders_migrations; "outbox" to the default tables' outbox_migrations):
	// the second must not take the first's versions for its own and leave its table unmade.
	t.Run("SharedVersionTable", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		for _, pair := range [][2]Tables{
			{{Messages: "orders"}, {Messages: "orders_messages"}},
			{{}, {Messages: "outbox"}},
		} {
			first, second := pair[0], pair[1]
			require.Equal(t, first.WithDefaults().Migrations, second.WithDefaults().Migrations)
			require.NoError(t, migrate(ctx, pool, first))
			err := migrate(ctx, pool, second)
			require.ErrorContains(t, err, "Tables.Migrations", "%s after %s", second, first)
			second.Migrations = second.WithDefaults().Messages + "_versions"
			require.NoError(t, migrate(ctx, pool, second), "with a version table of its own")
			require.Equal(t, []int{1, 2, 3}, versions(t, pool, second))
		}
	})

	t.Run("InvalidTables", func(t *testing.T) {
		t.Parallel()
		err := migrate(ctx, nil, Tables{Messages: strings.Repeat("x", MaxTableBytes+1)})
		require.ErrorIs(t, err, ErrInvalidTables)
		_, err = renderMigrations(Tables{Messages: "a$$b"})
		require.ErrorContains(t, err, "$$")
		for _, tables := range []Tables{{Messages: "a$$b"}, {Schema: "$$"}, {Migrations: "$$"}} {
			err = migrate(ctx, nil, tables)
			require.ErrorIs(t, err, ErrInvalidTables)
			require.ErrorContains(t, err, "contains $$")
		}
		require.ErrorIs(t, Tables{Messages: "m", Migrations: "a$$b"}.Validate(), ErrInvalidTables, "the version table is in the Down's DO body")
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

// requireNotifies adds a row to tables' outbox and waits for the trigger's notification on
// tables' channel.
func requireNotifies(t *testing.T, pool *pgxpool.Pool, tables Tables) {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{tables.NotifyChannel()}.Sanitize())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+tables.String()+
		` (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
		VALUES (gen_random_uuid(), 'x', 'k', 't', 'a', '1', '{}')`)
	require.NoError(t, err)
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wait)
	require.NoError(t, err, "no notification on %q", tables.NotifyChannel())
	require.Equal(t, tables.NotifyChannel(), n.Channel)
}

// BenchmarkMigrate is what Migrate costs on every start when the schema is current (a
// transaction that reads the version table), and what rendering the templates costs of it.
func BenchmarkMigrate(b *testing.B) {
	b.Run("Current", func(b *testing.B) {
		ctx := context.Background()
		pool := testinfra.NewPool(b)
		require.NoError(b, Migrate(ctx, pool))
		for b.Loop() {
			if err := Migrate(ctx, pool); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Render", func(b *testing.B) {
		for b.Loop() {
			if _, err := renderMigrations(Tables{Schema: "billing"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

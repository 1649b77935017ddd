package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestNewStoreRefusesInvalidTables(t *testing.T) {
	t.Parallel()
	for name, tables := range map[string]inbox.Tables{
		"MessagesTooLong":      {Messages: strings.Repeat("m", inbox.MaxTableBytes+1)},
		"SchemaTooLong":        {Schema: strings.Repeat("s", 64)},
		"MigrationsTooLong":    {Migrations: strings.Repeat("v", 64)},
		"NUL":                  {Messages: "in\x00box"},
		"NotUTF8":              {Schema: "\xff"},
		"MessagesIsMigrations": {Messages: "seen", Migrations: "seen"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := inbox.NewStore(tables)
			require.ErrorIs(t, err, inbox.ErrInvalidTables)
		})
	}
}

func TestStoreTables(t *testing.T) {
	t.Parallel()
	s, err := inbox.NewStore(inbox.Tables{})
	require.NoError(t, err)
	require.Equal(t, inbox.Tables{Messages: "inbox_messages", Migrations: "inbox_migrations"}, s.Tables())

	s, err = inbox.NewStore(inbox.Tables{Schema: "billing", Messages: "billing_messages"})
	require.NoError(t, err)
	require.Equal(t, inbox.Tables{Schema: "billing", Messages: "billing_messages", Migrations: "billing_migrations"}, s.Tables())
}

// newStore returns the migrated store of tables in pool's database.
func newStore(t *testing.T, pool *pgxpool.Pool, tables inbox.Tables) *inbox.Store {
	t.Helper()
	s, err := inbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background(), pool))
	return s
}

// process runs msg through s for consumer, recording an effect, and returns whether it was a
// duplicate.
func process(t *testing.T, s *inbox.Store, pool *pgxpool.Pool, consumer, id string) bool {
	t.Helper()
	dup, err := s.Process(context.Background(), pool, consumer, inbox.Message{ID: id, Type: "order.placed"},
		func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, message_id) VALUES ($1, $2)`, consumer, id)
			return err
		})
	require.NoError(t, err)
	return dup
}

// TestTwoInboxesInOneDatabase keeps two inboxes with tables of their own in one database: a
// message is deduplicated per table, and cleaning one leaves the other alone.
func TestTwoInboxesInOneDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newMigratedPool(t) // the default tables too, which stay empty
	ledger := newStore(t, pool, inbox.Tables{Messages: "ledger_inbox"})
	billing := newStore(t, pool, inbox.Tables{Messages: "billing_inbox"})

	// The same consumer name and message id in both: each table sees it once.
	require.False(t, process(t, ledger, pool, "payments", "m-1"))
	require.False(t, process(t, billing, pool, "payments", "m-1"))
	require.True(t, process(t, ledger, pool, "payments", "m-1"))
	require.True(t, process(t, billing, pool, "payments", "m-1"))
	require.False(t, process(t, billing, pool, "payments", "m-2"))
	require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM effects`))
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM ledger_inbox`))
	require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM billing_inbox`))
	require.Zero(t, countRows(t, pool, `SELECT count(*) FROM inbox_messages`), "the default table is not written")

	_, err := pool.Exec(ctx, `UPDATE ledger_inbox SET processed_at = now() - interval '30 days'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE billing_inbox SET processed_at = now() - interval '30 days'`)
	require.NoError(t, err)
	deleted, err := ledger.Cleanup(ctx, pool, inbox.CleanupConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted)
	require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM billing_inbox`), "cleaning ledger left billing alone")
	require.True(t, process(t, billing, pool, "payments", "m-1"))
}

// TestInboxInSchema keeps an inbox in schema billing, which the connections' search_path does
// not name: Migrate creates the schema, and Process and Cleanup find the table there.
func TestInboxInSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	var searchPath string
	require.NoError(t, pool.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
	require.NotContains(t, searchPath, "billing")

	s := newStore(t, pool, inbox.Tables{Schema: "billing"})
	require.False(t, process(t, s, pool, "payments", "m-1"))
	require.True(t, process(t, s, pool, "payments", "m-1"))
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM billing.inbox_messages`))
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM effects`))
	var inPublic bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('public.inbox_messages') IS NOT NULL").Scan(&inPublic))
	require.False(t, inPublic, "nothing is created in the search_path")

	_, err = pool.Exec(ctx, `UPDATE billing.inbox_messages SET processed_at = now() - interval '30 days'`)
	require.NoError(t, err)
	deleted, err := s.Cleanup(ctx, pool, inbox.CleanupConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted)

	_, err = inbox.Process(ctx, pool, "payments", inbox.Message{ID: "m-2"}, nil)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "the default table is not in search_path: %v", err)
	require.Equal(t, "42P01", pgErr.Code)
}

// TestInboxNamesThatNeedQuoting runs an inbox whose schema and table names have upper case,
// spaces and a double quote: every statement quotes them.
func TestInboxNamesThatNeedQuoting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newMigratedPool(t)
	s := newStore(t, pool, inbox.Tables{Schema: `Billing "EU"`, Messages: `Inbox Messages`, Migrations: `Inbox "Versions"`})
	require.False(t, process(t, s, pool, "payments", "m-1"))
	require.True(t, process(t, s, pool, "payments", "m-1"))
	const table = `"Billing ""EU"""."Inbox Messages"`
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM `+table))
	require.NotZero(t, countRows(t, pool, `SELECT count(*) FROM "Billing ""EU"""."Inbox ""Versions"""`), "versions recorded")

	_, err := pool.Exec(ctx, `UPDATE `+table+` SET processed_at = now() - $1::interval`, inbox.DefaultCleanupRetention+time.Hour)
	require.NoError(t, err)
	deleted, err := s.Cleanup(ctx, pool, inbox.CleanupConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted)
}

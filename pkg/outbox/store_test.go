package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestNewStoreRefusesInvalidTables(t *testing.T) {
	t.Parallel()
	for name, tables := range map[string]outbox.Tables{
		"MessagesTooLong":      {Messages: strings.Repeat("m", outbox.MaxTableBytes+1)},
		"SchemaTooLong":        {Schema: strings.Repeat("s", 64)},
		"MigrationsTooLong":    {Migrations: strings.Repeat("v", 64)},
		"NUL":                  {Messages: "out\x00box"},
		"NotUTF8":              {Schema: "\xff"},
		"MessagesIsMigrations": {Messages: "events", Migrations: "events"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := outbox.NewStore(tables)
			require.ErrorIs(t, err, outbox.ErrInvalidTables)
			_, err = outbox.NewRelay(&pgxpool.Pool{}, confirmAll{}, outbox.Config{Tables: tables})
			require.ErrorIs(t, err, outbox.ErrInvalidTables)
		})
	}
}

func TestStoreTables(t *testing.T) {
	t.Parallel()
	s, err := outbox.NewStore(outbox.Tables{})
	require.NoError(t, err)
	require.Equal(t, outbox.Tables{Messages: "outbox_messages", Migrations: "outbox_migrations"}, s.Tables())

	s, err = outbox.NewStore(outbox.Tables{Schema: "billing", Messages: "billing_messages"})
	require.NoError(t, err)
	require.Equal(t, outbox.Tables{Schema: "billing", Messages: "billing_messages", Migrations: "billing_migrations"}, s.Tables())
}

// tablesOutbox is one outbox of a test that runs several: its store, a topology of its own on
// the broker, and a consumer of that topology's queue.
type tablesOutbox struct {
	store *outbox.Store
	top   testinfra.Topology
	got   *received
	relay *outbox.Relay
}

// notifiedOnly makes a relay cycle only when a notification (or its start) wakes it: no
// polls, no re-checks, within a test's time. Such a relay publishes one row per aggregate for
// each notification: write rows of distinct aggregates.
func notifiedOnly(t *testing.T, tables outbox.Tables) outbox.Config {
	cfg := fastConfig(t)
	cfg.Tables = tables
	cfg.PollInterval = time.Hour
	cfg.NotifyRecheck = time.Hour
	return cfg
}

// newTablesOutbox migrates tables in b's database and runs a relay for them, woken by
// notifications only, that publishes through a publisher and to a topology of its own.
func newTablesOutbox(t *testing.T, b *bundle, pool *pgxpool.Pool, tables outbox.Tables, cfg func(*outbox.Config)) *tablesOutbox {
	t.Helper()
	ctx := context.Background()
	s, err := outbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx, pool))
	o := &tablesOutbox{store: s, top: testinfra.DeclareTopology(t, b.amqpURL)}
	o.got = consume(t, b.amqpURL, o.top.Queue)
	c := notifiedOnly(t, tables)
	if cfg != nil {
		cfg(&c)
	}
	o.relay = b.startRelay(t, pool, newPublisher(t, b.amqpURL), c)
	return o
}

// msg returns a message for o's exchange.
func (o *tablesOutbox) msg(b *bundle, aggregate string, n int) outbox.Message {
	m := b.msg(aggregate, n)
	m.Exchange = o.top.Exchange
	return m
}

// write adds msgs to o's table in one committed transaction on pool, and returns them with
// their ids.
func (o *tablesOutbox) write(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.store.Add(ctx, tx, msgs...) }))
	return msgs
}

// waitPublished waits until o's queue received exactly the messages want, each once, and
// nothing else.
func (o *tablesOutbox) waitPublished(t *testing.T, want ...outbox.Message) {
	t.Helper()
	testinfra.Eventually(t, waitFor, func() bool { return o.got.len() >= len(want) }, "%d messages published", len(want))
	got := o.got.ids()
	require.Len(t, got, len(want), "only this outbox's rows reach its exchange")
	for _, m := range want {
		require.Equal(t, 1, got[m.ID.String()], "message %s published once", m.ID)
	}
}

func (o *tablesOutbox) stats(t *testing.T, db outbox.DBTX) outbox.Stats {
	t.Helper()
	s, err := o.store.ReadStats(context.Background(), db)
	require.NoError(t, err)
	return s
}

// TestTwoOutboxesInOneDatabase runs two outboxes with tables of their own in one database,
// each with its own relay: each relay publishes its table's rows only, is woken by its
// table's notifications only, and a dead row of one is invisible to the other.
func TestTwoOutboxesInOneDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t) // also migrates the default tables, which stay empty
	ordersTables := outbox.Tables{Messages: "orders_outbox"}
	billingTables := outbox.Tables{Messages: "billing_outbox"}
	orders := newTablesOutbox(t, b, b.pool, ordersTables, nil)
	billing := newTablesOutbox(t, b, b.pool, billingTables, func(c *outbox.Config) { c.MaxAttempts = 1 })

	t.Run("EachRelayPublishesItsOwnRows", func(t *testing.T) {
		// The same aggregate in both: ordering is per table.
		o := orders.write(t, b.pool, orders.msg(b, "order-1", 1), orders.msg(b, "order-2", 1), orders.msg(b, "order-3", 1))
		bl := billing.write(t, b.pool, billing.msg(b, "order-1", 1))
		// The relays neither poll nor re-check: only their own table's notifications woke them.
		orders.waitPublished(t, o...)
		billing.waitPublished(t, bl...)
		require.Zero(t, b.count(t, "true"), "the default table is not written")
	})

	t.Run("NotificationsNameTheirTable", func(t *testing.T) {
		listener := b.conn(t)
		for _, tables := range []outbox.Tables{ordersTables, billingTables} {
			_, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{tables.NotifyChannel()}.Sanitize())
			require.NoError(t, err)
		}
		// Each write notifies its own table's channel, and only it: were the orders write to
		// notify billing's channel too, that notification would come before the billing one.
		for _, o := range []*tablesOutbox{orders, billing, orders} {
			o.write(t, b.pool, o.msg(b, "notify", 1))
			wctx, cancel := context.WithTimeout(ctx, waitFor)
			n, err := listener.WaitForNotification(wctx)
			cancel()
			require.NoError(t, err)
			require.Equal(t, o.store.Tables().NotifyChannel(), n.Channel)
		}
	})

	t.Run("DeadRowStaysInItsTable", func(t *testing.T) {
		// No such exchange: the broker refuses the row, and with MaxAttempts 1 it is dead.
		doomed := billing.write(t, b.pool, outbox.Message{
			Exchange: "no-such-exchange-" + uuid.NewString(), RoutingKey: "test.event", Type: "TestEvent",
			AggregateType: "test", AggregateID: "shared", Payload: []byte(`{}`),
		})[0]
		testinfra.Eventually(t, waitFor, func() bool { return billing.stats(t, b.pool).Dead == 1 }, "billing row dead")

		dead, err := billing.store.ListDead(ctx, b.pool, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, doomed.ID, dead[0].ID)
		dead, err = orders.store.ListDead(ctx, b.pool, 10)
		require.NoError(t, err)
		require.Empty(t, dead, "orders sees no dead row")
		require.Zero(t, orders.stats(t, b.pool).Dead)
		n, err := orders.store.Requeue(ctx, b.pool, doomed.ID)
		require.NoError(t, err)
		require.Zero(t, n, "orders cannot requeue billing's row")

		// The orders relay goes on, for the same aggregate too.
		shared := orders.write(t, b.pool, orders.msg(b, "shared", 1))[0]
		testinfra.Eventually(t, waitFor, func() bool { return orders.got.ids()[shared.ID.String()] == 1 }, "orders row published")

		// Requeue wakes billing's relay through billing's channel (it does not poll): the row
		// is tried again, and dies again.
		var deadAt time.Time
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT dead_at FROM billing_outbox WHERE id = $1", doomed.ID).Scan(&deadAt))
		n, err = billing.store.Requeue(ctx, b.pool, doomed.ID)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		testinfra.Eventually(t, waitFor, func() bool {
			var again *time.Time
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT dead_at FROM billing_outbox WHERE id = $1", doomed.ID).Scan(&again))
			return again != nil && again.After(deadAt)
		}, "requeued row tried again")
	})
}

// TestOutboxInSchema keeps an outbox in schema billing, which the connections' search_path
// does not name: Migrate creates the schema, and everything else finds the tables there.
func TestOutboxInSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &bundle{pool: testinfra.NewPool(t), amqpURL: testinfra.AMQPURL(t)}
	b.top = testinfra.DeclareTopology(t, b.amqpURL)
	var searchPath string
	require.NoError(t, b.pool.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
	require.NotContains(t, searchPath, "billing")

	tables := outbox.Tables{Schema: "billing"}
	o := newTablesOutbox(t, b, b.pool, tables, nil)
	msgs := o.write(t, b.pool, o.msg(b, "a", 1), o.msg(b, "b", 1), o.msg(b, "c", 1))
	o.waitPublished(t, msgs...)

	var inSchema, inPublic bool
	require.NoError(t, b.pool.QueryRow(ctx,
		"SELECT to_regclass('billing.outbox_messages') IS NOT NULL, to_regclass('public.outbox_messages') IS NOT NULL").Scan(&inSchema, &inPublic))
	require.True(t, inSchema)
	require.False(t, inPublic, "nothing is created in the search_path")
	testinfra.Eventually(t, waitFor, func() bool { return o.stats(t, b.pool) == outbox.Stats{} }, "every row marked published")
	_, err := b.pool.Exec(ctx, "UPDATE billing.outbox_messages SET published_at = now() - interval '30 days'")
	require.NoError(t, err)
	n, err := o.store.Cleanup(ctx, b.pool, outbox.CleanupConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)

	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, b.msg("d", 1)) })
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the default tables are not in search_path: %v", err)
	require.Equal(t, "42P01", pgErr.Code)
}

// TestNamesThatNeedQuoting runs an outbox whose schema and table names have upper case,
// spaces and a double quote: every statement quotes them.
func TestNamesThatNeedQuoting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tables := outbox.Tables{Schema: `Billing "EU"`, Messages: `Outbox Messages`, Migrations: `Outbox "Versions"`}
	o := newTablesOutbox(t, b, b.pool, tables, nil)
	msgs := o.write(t, b.pool, o.msg(b, "x", 1), o.msg(b, "y", 1))
	o.waitPublished(t, msgs...)

	var exists bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT to_regclass('"Billing ""EU"""."Outbox Messages"') IS NOT NULL`).Scan(&exists))
	require.True(t, exists)
	// A row that commits dead, as an operator would leave it, is listed and requeued.
	dead := o.msg(b, "z", 1)
	dead.ID = uuid.New()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := o.store.Add(ctx, tx, dead); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE "Billing ""EU"""."Outbox Messages" SET dead_at = now() WHERE id = $1`, dead.ID)
		return err
	}))
	listed, err := o.store.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, dead.ID, listed[0].ID)
	n, err := o.store.Requeue(ctx, b.pool, dead.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	o.waitPublished(t, append(msgs, dead)...)
	testinfra.Eventually(t, waitFor, func() bool { return o.stats(t, b.pool) == outbox.Stats{} }, "every row marked published")
	_, err = b.pool.Exec(ctx, `UPDATE "Billing ""EU"""."Outbox Messages" SET published_at = now() - interval '30 days'`)
	require.NoError(t, err)
	n, err = o.store.Cleanup(ctx, b.pool, outbox.CleanupConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Equal(t, outbox.Stats{}, o.stats(t, b.pool))
}

// relayDBOnly hides every method of a pool but RelayDB's.
type relayDBOnly struct{ outbox.RelayDB }

// listeningDB is relayDBOnly with the pool's Acquire, for the LISTEN connection.
type listeningDB struct {
	relayDBOnly
	pool *pgxpool.Pool
}

func (d listeningDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) { return d.pool.Acquire(ctx) }

// TestRelayNeedsOnlyRelayDB runs a relay on a RelayDB that is not a *pgxpool.Pool: woken by
// LISTEN when it has Acquire, polling without it, and refused without it unless it polls.
func TestRelayNeedsOnlyRelayDB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		db     func(*pgxpool.Pool) outbox.RelayDB
		notify bool
	}{
		{"ListenThroughAcquire", func(p *pgxpool.Pool) outbox.RelayDB { return listeningDB{relayDBOnly{p}, p} }, true},
		{"PollWithoutAcquire", func(p *pgxpool.Pool) outbox.RelayDB { return relayDBOnly{p} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			got := consume(t, b.amqpURL, b.top.Queue)
			cfg := fastConfig(t)
			if tc.notify {
				cfg.PollInterval, cfg.NotifyRecheck = time.Hour, time.Hour // woken by LISTEN only
			} else {
				_, err := outbox.NewRelay(tc.db(b.pool), b.pub, cfg)
				require.ErrorContains(t, err, "DisableNotify", "no LISTEN connection, and not told to poll")
				cfg.DisableNotify = true
			}
			r, err := outbox.NewRelay(tc.db(b.pool), b.pub, cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				require.NoError(t, <-done)
			})
			msgs := b.write(t, b.msg("a", 1), b.msg("b", 1))
			testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == len(msgs) }, "published")
		})
	}
}

package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// dbNow reads the database's clock.
func dbNow(t testing.TB, db *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.QueryRow(context.Background(), "SELECT now()").Scan(&now))
	return now
}

// TestPartitioned: an outbox table partitioned by hour. Migrate makes it and the next hours'
// partitions, and refuses a Tables that says otherwise than the table; a relay publishes rows
// of old partitions and new ones, one aggregate's in order across them; Cleanup drops a
// partition whole once all its rows are published and its retention is over, and keeps one
// that holds a pending or a dead row (deleting its published rows) until they are gone;
// ReadStats, ListDead and Requeue see every partition.
func TestPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tables := outbox.Tables{Partition: time.Hour}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	b := &bundle{pool: testinfra.NewPool(t), amqpURL: testinfra.AMQPURL(t)}
	require.NoError(t, store.Migrate(ctx, b.pool))
	b.top = testinfra.DeclareTopology(t, b.amqpURL)
	b.pub = newPublisher(t, b.amqpURL)

	now := dbNow(t, b.pool)
	hour := now.Truncate(time.Hour)
	testinfra.RequireContiguous(t, testinfra.Partitions(t, b.pool, "outbox_messages"), now, now.Add(3*time.Hour-time.Second))
	made := len(testinfra.Partitions(t, b.pool, "outbox_messages"))
	require.NoError(t, store.Migrate(ctx, b.pool), "a second time")
	require.Len(t, testinfra.Partitions(t, b.pool, "outbox_messages"), made, "nothing more made")

	t.Run("MigrateRefusesATablesThatSaysOtherwise", func(t *testing.T) {
		err := outbox.Migrate(ctx, b.pool)
		require.ErrorContains(t, err, "is a partitioned table: set Tables.Partition")
		plain := testinfra.NewPool(t)
		require.NoError(t, outbox.Migrate(ctx, plain))
		err = store.Migrate(ctx, plain)
		require.ErrorContains(t, err, "Tables.Partition is 1h0m0s but \"outbox_messages\" is a plain table")
	})

	// Three partitions of the past hours, made by hand, with rows written into them by hand
	// (a writer's rows are stamped with its transaction's start).
	for i := 3; i >= 1; i-- {
		from := hour.Add(-time.Duration(i+2) * time.Hour)
		_, err := b.pool.Exec(ctx, fmt.Sprintf("CREATE TABLE old_%d PARTITION OF outbox_messages FOR VALUES FROM ('%s') TO ('%s')",
			i, from.UTC().Format(time.RFC3339), from.Add(time.Hour).UTC().Format(time.RFC3339)))
		require.NoError(t, err)
	}
	insertAt := func(m outbox.Message, at time.Time) uuid.UUID {
		id := uuid.New()
		_, err := b.pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::json, $8)`,
			id, m.Exchange, m.RoutingKey, m.Type, m.AggregateType, m.AggregateID, string(m.Payload), at)
		require.NoError(t, err)
		return id
	}
	var order []string // aggregate "a" across the partitions
	for n := range 5 {
		order = append(order, insertAt(b.msg("a", n), hour.Add(-270*time.Minute)).String()) // old_3
		insertAt(b.msg(fmt.Sprintf("b-%d", n), n), hour.Add(-210*time.Minute))              // old_2
		insertAt(b.msg(fmt.Sprintf("c-%d", n), n), hour.Add(-150*time.Minute))              // old_1
	}
	big := b.msg("big", 0)
	big.Payload = json.RawMessage(`{"p":"` + strings.Repeat("x", 2<<10) + `"}`)
	bigID := insertAt(big, hour.Add(-200*time.Minute)) // old_2: dies
	for n := 5; n < 10; n++ {
		m := b.write(t, b.msg("a", n))[0]
		order = append(order, m.ID.String())
	}

	cleanup := outbox.CleanupConfig{Retention: time.Hour, Logger: testLogger(t)}
	// backdate makes the published rows look published two hours ago, past the retention.
	backdate := func() {
		_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = published_at - interval '2 hours' WHERE published_at > now() - interval '1 hour'")
		require.NoError(t, err)
	}
	deleted, err := store.Cleanup(ctx, b.pool, cleanup)
	require.NoError(t, err)
	require.EqualValues(t, 0, deleted, "every row pending: nothing dropped")
	require.Len(t, testinfra.Partitions(t, b.pool, "outbox_messages"), made+3)

	got := consume(t, b.amqpURL, b.top.Queue)
	cfg := fastConfig(t)
	cfg.Tables = tables
	cfg.BatchSize = 4
	cfg.MaxMessageBytes = 1 << 10
	b.startRelay(t, b.pool, b.pub, cfg)
	testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 20 }, "every healthy row delivered")
	var aOrder []string
	seen := map[string]bool{}
	for _, d := range got.all() {
		if d.Headers["aggregate_id"] == "a" && !seen[d.MessageId] {
			seen[d.MessageId] = true
			aOrder = append(aOrder, d.MessageId)
		}
	}
	require.Equal(t, order, aOrder, "one aggregate's rows in order across partitions")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "dead_at IS NOT NULL") == 1 }, "the big row dead")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL AND dead_at IS NULL") == 0 }, "every other row marked")

	deleted, err = store.Cleanup(ctx, b.pool, cleanup)
	require.NoError(t, err)
	require.EqualValues(t, 0, deleted, "every row published within the retention")
	require.Len(t, oldPartitions(t, b), 3)
	backdate()
	// Two cleaners at once: each drops what the other did not, and neither fails.
	var both [2]int64
	var cleaners sync.WaitGroup
	for i := range both {
		cleaners.Go(func() {
			n, err := store.Cleanup(ctx, b.pool, cleanup)
			require.NoError(t, err)
			both[i] = n
		})
	}
	cleaners.Wait()
	third, err := store.Cleanup(ctx, b.pool, cleanup) // what a cleaner that found the other at it left
	require.NoError(t, err)
	require.EqualValues(t, 5+5+5, both[0]+both[1]+third,
		"the rows of old_1 and old_3, and the published rows of old_2, once; the current partition's are left whole")
	require.Equal(t, []string{"old_2"}, oldPartitions(t, b), "old_1 and old_3 dropped; old_2 holds the dead row")
	require.Equal(t, 5, b.count(t, "true")-1, "the current partition's rows, and the dead one")
	st, err := store.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Dead)
	dead, err := store.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, bigID, dead[0].ID)

	// The dead row fixed and requeued, while a transaction that wrote into old_2 is still
	// open: the partition is not dropped under it, and its lock is not waited for longer
	// than a moment.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_messages SET payload = '{"p":"fixed"}' WHERE id = $1`, bigID)
	require.NoError(t, err)
	n, err := store.Requeue(ctx, b.pool, bigID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testinfra.Eventually(t, waitFor, func() bool { return got.ids()[bigID.String()] == 1 }, "the requeued row delivered")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "and marked")
	deleted, err = store.Cleanup(ctx, b.pool, cleanup)
	require.NoError(t, err)
	require.EqualValues(t, 0, deleted, "a row published late keeps its partition for the retention")
	require.Equal(t, []string{"old_2"}, oldPartitions(t, b))
	backdate()
	open, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer open.Rollback(ctx) //nolint:errcheck // committed below
	lateID := uuid.New()
	late := b.msg("late", 0)
	_, err = open.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::json, $8)`,
		lateID, late.Exchange, late.RoutingKey, late.Type, late.AggregateType, late.AggregateID, string(late.Payload), hour.Add(-190*time.Minute))
	require.NoError(t, err)
	start := time.Now()
	deleted, err = store.Cleanup(ctx, b.pool, cleanup)
	require.NoError(t, err, "a busy table is no error")
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, []string{"old_2"}, oldPartitions(t, b), "kept while a writer holds it")
	require.EqualValues(t, 1, deleted, "the requeued row, deleted as a row")
	require.NoError(t, open.Commit(ctx))
	testinfra.Eventually(t, waitFor, func() bool { return got.ids()[lateID.String()] == 1 }, "the late row delivered")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "and marked")
	backdate()
	deleted, err = store.Cleanup(ctx, b.pool, cleanup)
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted, "the late row, in old_2")
	require.Empty(t, oldPartitions(t, b))
	require.Equal(t, 5, b.count(t, "true"), "the current partition's rows")
	for id, n := range got.ids() {
		require.Equal(t, 1, n, "%s delivered once", id)
	}
}

// oldPartitions lists the partitions TestPartitioned made by hand that are still there.
func oldPartitions(t testing.TB, b *bundle) []string {
	var names []string
	for _, p := range testinfra.Partitions(t, b.pool, "outbox_messages") {
		if strings.HasPrefix(p.Name, "old_") {
			names = append(names, p.Name)
		}
	}
	return names
}

// isLockTimeout tells whether err is PostgreSQL's lock_not_available: a partition step that
// did not get the table's lock in time (a relay's transaction held it, on a loaded machine).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// TestPartitionsMadeUnderLoad: writers write while two cleaners make half an hour more of
// one-minute partitions: no write fails, the partitions follow each other without a gap or
// an overlap, and a relay publishes every row once.
func TestPartitionsMadeUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tables := outbox.Tables{Messages: "minutes", Partition: time.Minute}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	b := &bundle{pool: testinfra.NewPool(t), amqpURL: testinfra.AMQPURL(t)}
	require.NoError(t, store.Migrate(ctx, b.pool))
	b.top = testinfra.DeclareTopology(t, b.amqpURL)
	b.pub = newPublisher(t, b.amqpURL)
	got := consume(t, b.amqpURL, b.top.Queue)
	cfg := fastConfig(t)
	cfg.Tables = tables
	b.startRelay(t, b.pool, b.pub, cfg)

	stop := make(chan struct{})
	var written atomic.Int64
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					return store.Add(ctx, tx, b.msg(fmt.Sprintf("w%d", w), n))
				})
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				written.Add(1)
			}
		})
	}
	var cleaners sync.WaitGroup
	for range 2 {
		cleaners.Go(func() {
			for range 3 { // a cleaner that found the other at it makes none; the next run does
				_, err := store.Cleanup(ctx, b.pool, outbox.CleanupConfig{PartitionsAhead: 90 * time.Minute, Logger: testLogger(t)})
				if err != nil && !isLockTimeout(err) { // the next run's
					t.Errorf("cleanup: %v", err)
				}
			}
		})
	}
	cleaners.Wait()
	close(stop)
	writers.Wait()
	require.Positive(t, written.Load())
	// A cleaner gives up a partition whose lock it did not get in time: the runs after it
	// make the rest.
	testinfra.Eventually(t, waitFor, func() bool {
		_, err := store.Cleanup(ctx, b.pool, outbox.CleanupConfig{PartitionsAhead: 90 * time.Minute})
		require.True(t, err == nil || isLockTimeout(err), "%v", err)
		parts := testinfra.Partitions(t, b.pool, "minutes")
		return parts[len(parts)-1].To.After(dbNow(t, b.pool).Add(89 * time.Minute))
	}, "an hour and a half of partitions")
	now := dbNow(t, b.pool)
	testinfra.RequireContiguous(t, testinfra.Partitions(t, b.pool, "minutes"), now, now.Add(89*time.Minute))
	testinfra.Eventually(t, waitFor, func() bool { return int64(len(got.ids())) == written.Load() }, "every row delivered")
}

// TestPartitionMadeBesideALongTransaction: a partition is made and attached while a writer's
// transaction on the table stays open, which the table's ACCESS EXCLUSIVE lock (CREATE TABLE
// … PARTITION OF) would have waited for, and given up on: the writer is not held up, nor the
// making.
func TestPartitionMadeBesideALongTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tables := outbox.Tables{Messages: "beside", Partition: time.Hour}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	b := &bundle{pool: testinfra.NewPool(t)}
	require.NoError(t, store.Migrate(ctx, b.pool))
	before := len(testinfra.Partitions(t, b.pool, "beside"))

	writer, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(context.Background()) }()
	require.NoError(t, store.Add(ctx, writer, b.msg("a", 1)))
	_, err = store.Cleanup(ctx, b.pool, outbox.CleanupConfig{PartitionsAhead: 6 * time.Hour})
	require.NoError(t, err, "partitions made while the writer's transaction is open")
	require.Greater(t, len(testinfra.Partitions(t, b.pool, "beside")), before)
	require.NoError(t, store.Add(ctx, writer, b.msg("a", 2)), "the writer goes on")
	require.NoError(t, writer.Commit(ctx))
}

// TestPartitionedTablesValidate: a partition length PostgreSQL's grid cannot hold is refused.
func TestPartitionedTablesValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []time.Duration{time.Second, 59 * time.Second, 90 * time.Second, 7 * time.Minute, 25 * time.Hour, -time.Hour} {
		_, err := outbox.NewStore(outbox.Tables{Partition: p})
		require.ErrorIs(t, err, outbox.ErrInvalidTables, "%s", p)
	}
	for _, p := range []time.Duration{time.Minute, 5 * time.Minute, time.Hour, 8 * time.Hour, 24 * time.Hour} {
		_, err := outbox.NewStore(outbox.Tables{Partition: p})
		require.NoError(t, err, "%s", p)
	}
}

// TestPartitionedRefusals: what would hold the writers up, drop rows early or misread the
// partitions is refused, naming the fix.
func TestPartitionedRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	tables := outbox.Tables{Partition: time.Hour}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))

	t.Run("AStoreWithoutPartitionCleansNothing", func(t *testing.T) {
		_, err := outbox.Cleanup(ctx, pool, outbox.CleanupConfig{})
		require.ErrorContains(t, err, "is a partitioned table: set Tables.Partition")
	})
	t.Run("ARetentionShorterThanAPartition", func(t *testing.T) {
		_, err := store.Cleanup(ctx, pool, outbox.CleanupConfig{Retention: 59 * time.Minute})
		require.ErrorContains(t, err, "shorter than a partition")
	})
	t.Run("ATransaction", func(t *testing.T) {
		// Its locks and settings would last until it ends, holding the writers up.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Cleanup(ctx, tx, outbox.CleanupConfig{})
			return err
		})
		require.ErrorContains(t, err, "give a pool or a connection")
	})
	t.Run("ASessionNotInISODateStyle", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Asia/Kolkata'")
		require.NoError(t, err)
		_, err = store.ReadStats(ctx, conn)
		require.ErrorContains(t, err, "DateStyle ISO")
		// Cleanup reads the bounds in a transaction that sets ISO: it makes no partition
		// over the ones there (which a misread bound would: "would overlap").
		_, err = store.Cleanup(ctx, conn.Conn(), outbox.CleanupConfig{})
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "RESET DateStyle; RESET TimeZone")
		require.NoError(t, err)
	})
	t.Run("ADefaultPartition", func(t *testing.T) {
		pool := testinfra.NewPool(t)
		require.NoError(t, store.Migrate(ctx, pool))
		_, err := pool.Exec(ctx, "CREATE TABLE outbox_default PARTITION OF outbox_messages DEFAULT")
		require.NoError(t, err)
		_, err = store.Cleanup(ctx, pool, outbox.CleanupConfig{})
		require.ErrorContains(t, err, "has a DEFAULT partition")
		require.ErrorContains(t, store.Migrate(ctx, pool), "has a DEFAULT partition")
	})
}

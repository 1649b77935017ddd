package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// dbNow reads the database's clock.
func dbNow(t testing.TB, db *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.QueryRow(context.Background(), "SELECT now()").Scan(&now))
	return now
}

// partitionedInbox returns a fresh database with a partitioned inbox of tables migrated, and
// the effects table of the test handlers.
func partitionedInbox(t testing.TB, tables inbox.Tables) (*pgxpool.Pool, *inbox.Store) {
	t.Helper()
	ctx := context.Background()
	store, err := inbox.NewStore(tables)
	require.NoError(t, err)
	pool := testinfra.NewPool(t)
	require.NoError(t, store.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	return pool, store
}

// pastPartition makes by hand the partition of store's table that holds at, and records in
// it message id of consumer as processed at at: a message processed that long ago.
func pastPartition(t testing.TB, pool *pgxpool.Pool, store *inbox.Store, consumer, id string, at time.Time) string {
	t.Helper()
	ctx := context.Background()
	tables := store.Tables()
	lo := at.Truncate(tables.Partition)
	name := tables.Messages + "_p" + lo.UTC().Format("200601021504")
	qualified := pgx.Identifier{name}.Sanitize()
	if tables.Schema != "" {
		qualified = pgx.Identifier{tables.Schema, name}.Sanitize()
	}
	_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		qualified, tables, lo.UTC().Format(time.RFC3339), lo.Add(tables.Partition).UTC().Format(time.RFC3339)))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, message_id, message_type, received_at, processed_at)
VALUES ($1, $2, 'order.placed', $3, $3)`, tables), consumer, id, at)
	require.NoError(t, err)
	return name
}

// TestPartitioned: an inbox partitioned by hour, in a schema of its own. Migrate makes the
// next hours' partitions; a copy of a message processed in an older partition is a
// duplicate, through Process and ProcessBatch alike; Cleanup drops a partition whole once its
// range ended a retention ago, and a copy that arrives after that is processed again, as the
// retention says; a partition whose range has not ended that long ago stays.
func TestPartitioned(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, store := partitionedInbox(t, inbox.Tables{Schema: "Part Inbox", Messages: "seen", Partition: time.Hour})
	table := store.Tables().String()
	now := dbNow(t, pool)
	testinfra.RequireContiguous(t, testinfra.Partitions(t, pool, table), now, now.Add(time.Hour))

	// Processed 3 days ago and 20 hours ago, each in its own partition.
	old := pastPartition(t, pool, store, "billing", "m-old", now.Add(-72*time.Hour))
	recent := pastPartition(t, pool, store, "billing", "m-recent", now.Add(-20*time.Hour))

	for _, id := range []string{"m-old", "m-recent"} {
		dup, err := store.Process(ctx, pool, "billing", inbox.Message{ID: id, Type: "order.placed"}, recordEffect("billing", id))
		require.NoError(t, err)
		require.True(t, dup, "%s, processed in an older partition, is a duplicate", id)
		results, err := store.ProcessBatch(ctx, pool, "billing", []inbox.Message{{ID: id}, {ID: id + "-new"}},
			func(ctx context.Context, tx pgx.Tx, i int) error {
				return recordEffect("billing", fmt.Sprint(i))(ctx, tx)
			})
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{Duplicate: true}, {}}, results, "%s in a batch", id)
	}
	// Another consumer's copy is its own.
	dup, err := store.Process(ctx, pool, "shipping", inbox.Message{ID: "m-old"}, nil)
	require.NoError(t, err)
	require.False(t, dup)
	require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM effects`), "the batches' new messages only")

	// Retention 24h: the partition of three days ago goes whole, the one of 20 hours ago and
	// the current ones stay; no row is deleted one by one.
	cfg := inbox.CleanupConfig{Retention: 24 * time.Hour}
	deleted, err := store.Cleanup(ctx, pool, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted, "the old partition's one row")
	require.NotContains(t, names(testinfra.Partitions(t, pool, table)), old)
	require.Contains(t, names(testinfra.Partitions(t, pool, table)), recent)
	require.Equal(t, 4, countRows(t, pool, `SELECT count(*) FROM `+table), "the rest of the rows")

	// The copy of the message whose row went with its partition is processed again: the
	// retention is over. The recent one is still a duplicate.
	dup, err = store.Process(ctx, pool, "billing", inbox.Message{ID: "m-old"}, recordEffect("billing", "m-old"))
	require.NoError(t, err)
	require.False(t, dup, "a copy after the retention is processed again")
	dup, err = store.Process(ctx, pool, "billing", inbox.Message{ID: "m-recent"}, recordEffect("billing", "m-recent"))
	require.NoError(t, err)
	require.True(t, dup)

	// A second run finds nothing to drop.
	deleted, err = store.Cleanup(ctx, pool, cfg)
	require.NoError(t, err)
	require.Zero(t, deleted)
}

// TestPartitionedCopiesAtOnce: copies of one message processed at once, by Process and by
// ProcessBatch (whose batches share messages, in different orders, and sometimes hold a
// message that fails, which makes the batch run again with savepoints), commit its effect
// once, as the unique key does on a plain table; in every pgx query exec mode, and with the
// table named two ways ("inbox_messages", "public"."inbox_messages") by the processes. The
// copies' transactions begin at different times, so their rows' keys differ: only the
// message's lock keeps the second out.
func TestPartitionedCopiesAtOnce(t *testing.T) {
	t.Parallel()
	for mode := range testinfra.QueryExecModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := testinfra.NewPoolInMode(t, mode)
			stores := make([]*inbox.Store, 2)
			for i, tables := range []inbox.Tables{{Partition: time.Hour}, {Schema: "public", Partition: time.Hour}} {
				var err error
				stores[i], err = inbox.NewStore(tables)
				require.NoError(t, err)
			}
			require.NoError(t, stores[0].Migrate(ctx, pool))
			_, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
			require.NoError(t, err)
			boom := errors.New("the handler failed")
			const copies, rounds = 6, 15
			for round := range rounds {
				id, other, failing := fmt.Sprintf("m-%d", round), fmt.Sprintf("o-%d", round), fmt.Sprintf("f-%d", round)
				var wg sync.WaitGroup
				errs := make(chan error, copies)
				for c := range copies {
					store := stores[c%2]
					wg.Go(func() {
						if c < 2 {
							_, err := store.Process(ctx, pool, "billing", inbox.Message{ID: id}, recordEffect("billing", id))
							errs <- err
							return
						}
						msgs := []inbox.Message{{ID: id}, {ID: other}, {ID: failing}}
						if c%2 == 1 {
							msgs[0], msgs[1] = msgs[1], msgs[0]
						}
						results, err := store.ProcessBatch(ctx, pool, "billing", msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
							if msgs[i].ID == failing && c == 2 {
								return boom
							}
							return recordEffect("billing", msgs[i].ID)(ctx, tx)
						})
						for _, r := range results {
							if !errors.Is(r.Err, boom) {
								err = errors.Join(err, r.Err)
							}
						}
						errs <- err
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
			}
			require.Zero(t, countRows(t, pool, `SELECT count(*) FROM (SELECT message_id FROM effects GROUP BY 1 HAVING count(*) > 1) d`),
				"a message's effect committed twice")
			require.Equal(t, 3*rounds, countRows(t, pool, `SELECT count(*) FROM effects`))
			require.Equal(t, 3*rounds, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))
		})
	}
}

// TestPartitionedRefusals: what a partitioned inbox refuses, each with its reason: a
// transaction at another level than READ COMMITTED (held, not the message's fault), a
// Cleanup given a transaction or a retention shorter than a partition, and a Tables whose
// layout is not the table's, in either direction. A message whose row falls in no partition
// is the database's fault, and goes through once Cleanup made the partition.
func TestPartitionedRefusals(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, store := partitionedInbox(t, inbox.Tables{Partition: time.Hour})

	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		_, err = store.Process(ctx, tx, "billing", inbox.Message{ID: "m-1"}, nil)
		require.ErrorIs(t, err, inbox.ErrIsolation, "%s", iso)
		require.Equal(t, inbox.ClassTransient, inbox.Classify(err))
		require.NoError(t, tx.Rollback(ctx))

		tx, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		_, err = store.ProcessBatch(ctx, tx, "billing", []inbox.Message{{ID: "m-1"}, {ID: "m-2"}}, nil)
		require.ErrorIs(t, err, inbox.ErrIsolation, "%s", iso)
		require.Equal(t, inbox.ClassTransient, inbox.Classify(err))
		require.NoError(t, tx.Rollback(ctx))
	}

	// A session whose default is SERIALIZABLE: the transactions the store begins itself are at
	// READ COMMITTED.
	serializable, err := pgxpool.New(ctx, pool.Config().ConnString()+"&default_transaction_isolation=serializable")
	require.NoError(t, err)
	defer serializable.Close()
	dup, err := store.Process(ctx, serializable, "billing", inbox.Message{ID: "s-1"}, nil)
	require.NoError(t, err)
	require.False(t, dup)
	results, err := store.ProcessBatch(ctx, serializable, "billing", []inbox.Message{{ID: "s-1"}, {ID: "s-2"}}, nil)
	require.NoError(t, err)
	require.Equal(t, []inbox.Result{{Duplicate: true}, {}}, results)

	day := inbox.CleanupConfig{Retention: 24 * time.Hour}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = store.Cleanup(ctx, tx, day)
	require.ErrorContains(t, err, "give a pool or a connection")
	require.NoError(t, tx.Rollback(ctx))
	_, err = store.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 30 * time.Minute})
	require.ErrorContains(t, err, "shorter than a partition")

	// A plain Tables on this partitioned table, and the other way round.
	_, err = inbox.Cleanup(ctx, pool, inbox.CleanupConfig{})
	require.ErrorContains(t, err, "is a partitioned table: set Tables.Partition")
	require.ErrorContains(t, inbox.Migrate(ctx, pool), "is a partitioned table: set Tables.Partition")
	plain := newMigratedPool(t)
	require.ErrorContains(t, store.Migrate(ctx, plain), "is a plain table")
	_, err = store.Cleanup(ctx, plain, day)
	require.ErrorContains(t, err, "is a plain table")

	// A DEFAULT partition.
	_, err = pool.Exec(ctx, `CREATE TABLE inbox_messages_default PARTITION OF inbox_messages DEFAULT`)
	require.NoError(t, err)
	_, err = store.Cleanup(ctx, pool, day)
	require.ErrorContains(t, err, "DEFAULT partition")
	_, err = pool.Exec(ctx, `DROP TABLE inbox_messages_default`)
	require.NoError(t, err)

	// No partition for now: the message is held, and goes through once one is made.
	for _, p := range testinfra.Partitions(t, pool, "inbox_messages") {
		_, err := pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{p.Name}.Sanitize())
		require.NoError(t, err)
	}
	_, err = store.Process(ctx, pool, "billing", inbox.Message{ID: "m-1"}, recordEffect("billing", "m-1"))
	require.Error(t, err)
	require.Equal(t, inbox.ClassTransient, inbox.Classify(err), "%v", err)
	results, err = store.ProcessBatch(ctx, pool, "billing", []inbox.Message{{ID: "m-1"}, {ID: "m-2"}}, nil)
	require.NoError(t, err)
	for _, r := range results {
		require.Equal(t, inbox.ClassTransient, inbox.Classify(r.Err), "%v", r.Err)
	}
	_, err = store.Cleanup(ctx, pool, day)
	require.NoError(t, err)
	dup, err = store.Process(ctx, pool, "billing", inbox.Message{ID: "m-1"}, recordEffect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, dup)
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM effects`))

	for _, p := range []time.Duration{time.Second, 59 * time.Second, 7 * time.Minute, 25 * time.Hour, -time.Hour} {
		_, err := inbox.NewStore(inbox.Tables{Partition: p})
		require.ErrorIs(t, err, inbox.ErrInvalidTables, "%s", p)
	}
	_, err = store.Cleanup(ctx, pool, inbox.CleanupConfig{PartitionsAhead: -time.Hour})
	require.ErrorContains(t, err, "partitions ahead")
	// Hourly partitions with the default retention, a week, and three ahead: 173 partitions.
	_, err = store.Cleanup(ctx, pool, inbox.CleanupConfig{})
	require.ErrorContains(t, err, "keeps 173 partitions of 1h0m0s, more than 64 (MaxPartitions)")
	_, err = store.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 59 * time.Hour}) // 59+2+3
	require.NoError(t, err)
	_, err = store.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 59 * time.Hour, PartitionsAhead: 3*time.Hour + time.Minute})
	require.ErrorContains(t, err, "keeps 65 partitions")
}

// TestPartitionsMadeUnderLoad: one-minute partitions, 30 of them, made by two cleaners at
// once (which spell the table two ways) while consumers process new messages and copies of
// them: no message fails, none is applied twice, and the partitions come out contiguous.
func TestPartitionsMadeUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, store := partitionedInbox(t, inbox.Tables{Partition: time.Minute})
	// The other spelling of the same table, for the second cleaner.
	public, err := inbox.NewStore(inbox.Tables{Schema: "public", Partition: time.Minute})
	require.NoError(t, err)
	// The current partition and the next left: Migrate made an hour of them.
	now := dbNow(t, pool)
	for _, p := range testinfra.Partitions(t, pool, "inbox_messages") {
		if p.From.After(now.Add(time.Minute)) {
			_, err := pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{p.Name}.Sanitize())
			require.NoError(t, err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("m-%d", i/2) // each message twice, by two workers at once or one after the other
				if _, err := store.Process(ctx, pool, "billing", inbox.Message{ID: id}, recordEffect("billing", id)); err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		})
	}
	var cleaners sync.WaitGroup
	for _, cleaner := range []*inbox.Store{store, public} {
		cleaners.Go(func() {
			if _, err := cleaner.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 5 * time.Minute, PartitionsAhead: 30 * time.Minute}); err != nil {
				errs <- err
			}
		})
	}
	cleaners.Wait()
	// And once more, each: what the other skipped while it was at it.
	for _, cleaner := range []*inbox.Store{store, public} {
		_, err := cleaner.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 5 * time.Minute, PartitionsAhead: 30 * time.Minute})
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	now = dbNow(t, pool)
	testinfra.RequireContiguous(t, testinfra.Partitions(t, pool, "inbox_messages"), now, now.Add(29*time.Minute))
	require.Zero(t, countRows(t, pool, `SELECT count(*) FROM (SELECT message_id FROM effects GROUP BY 1 HAVING count(*) > 1) d`),
		"a message's effect committed twice")
	require.Positive(t, countRows(t, pool, `SELECT count(*) FROM effects`))
}

// TestPartitionsKeptUnderLongTransactions: consumers whose transactions (half a second each)
// overlap without a gap never leave the table's ACCESS EXCLUSIVE lock free; Cleanup makes
// partitions and drops an old one all the same, without holding them up. A drop cut short
// (its run ends while a transaction on the table goes on) is finished by the next run; a
// partition detached and not dropped (a process that died between the two) is dropped by
// the next run, and a table of a similar name that Cleanup did not make is left alone.
func TestPartitionsKeptUnderLongTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	small, store := partitionedInbox(t, inbox.Tables{Partition: time.Hour})
	// Room for the six workers, the cleaner and the test's own statements.
	config := small.Config().Copy()
	config.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	now := dbNow(t, pool)
	old := pastPartition(t, pool, store, "billing", "m-old", now.Add(-72*time.Hour))
	cfg := inbox.CleanupConfig{Retention: 24 * time.Hour, PartitionsAhead: 8 * time.Hour}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var started atomic.Int64
	errs := make(chan error, 8)
	for w := range 6 {
		wg.Go(func() {
			// Staggered starts, so that the transactions overlap without a gap (a pace, not a
			// wait for anything).
			time.Sleep(time.Duration(w) * 80 * time.Millisecond)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := store.Process(ctx, pool, "billing", inbox.Message{ID: id}, func(ctx context.Context, tx pgx.Tx) error {
					if i == 0 {
						started.Add(1)
					}
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.5)")
					return err
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	testinfra.Eventually(t, 20*time.Second, func() bool { return started.Load() == 6 }, "the workers' transactions run")
	before := len(testinfra.Partitions(t, pool, "inbox_messages"))
	deleted, err := store.Cleanup(ctx, pool, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted)
	parts := testinfra.Partitions(t, pool, "inbox_messages")
	require.NotContains(t, names(parts), old)
	require.Greater(t, len(parts), before-1, "partitions made ahead")
	testinfra.RequireContiguous(t, parts, now, now.Add(7*time.Hour))

	// A drop cut short: a transaction on the table outlives the run; the next run finishes it
	// while the workers go on.
	old = pastPartition(t, pool, store, "billing", "m-old-2", now.Add(-48*time.Hour))
	long, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = long.Exec(ctx, "SELECT count(*) FROM inbox_messages")
	require.NoError(t, err)
	detaching := func() int {
		return countRows(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'ALTER TABLE % DETACH PARTITION % CONCURRENTLY' AND state = 'active'`)
	}
	run, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := store.Cleanup(run, pool, cfg)
		done <- err
	}()
	pending := func() int {
		return countRows(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'inbox_messages'::regclass AND inhdetachpending`)
	}
	// Its first transaction done, the detach waits for the long one.
	testinfra.Eventually(t, 20*time.Second, func() bool { return detaching() == 1 && pending() == 1 }, "the detach waits for the long transaction")
	cancel()
	require.Error(t, <-done)
	testinfra.Eventually(t, 20*time.Second, func() bool { return detaching() == 0 }, "the detach is cancelled")
	require.Equal(t, 1, pending(), "the partition is left detaching")
	require.NoError(t, long.Rollback(ctx))
	_, err = store.Cleanup(ctx, pool, cfg)
	require.NoError(t, err)
	require.NotContains(t, names(testinfra.Partitions(t, pool, "inbox_messages")), old)
	require.Zero(t, countRows(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, old), "dropped")
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// A partition Cleanup made, detached and left apart; and a table that merely looks like one.
	parts = testinfra.Partitions(t, pool, "inbox_messages")
	last := parts[len(parts)-1].Name
	_, err = pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE inbox_messages DETACH PARTITION %s`, pgx.Identifier{last}.Sanitize()))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE inbox_messages_p202001010000 (LIKE inbox_messages)`)
	require.NoError(t, err)
	_, err = store.Cleanup(ctx, pool, cfg)
	require.NoError(t, err)
	require.Zero(t, countRows(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1 AND NOT relispartition`, last),
		"the partition left apart is dropped")
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM pg_class WHERE relname = 'inbox_messages_p202001010000'`),
		"a table Cleanup did not make stays")
	testinfra.RequireContiguous(t, testinfra.Partitions(t, pool, "inbox_messages"), now, now.Add(7*time.Hour))
}

// TestPartitionKeptForAnOlderTransaction: a partition whose range ended is not detached while
// a transaction that began before its end is open, one that may still write in it; it is
// once that transaction ended.
func TestPartitionKeptForAnOlderTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, store := partitionedInbox(t, inbox.Tables{Partition: time.Hour})
	before := testinfra.Partitions(t, pool, "inbox_messages")
	older, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = older.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	// A cutoff two hours ahead: the current partition's range ends by it, but began before
	// the transaction's start.
	cutoff := dbNow(t, pool).Add(2 * time.Hour)
	dropped, err := inbox.DropPartitionsBefore(ctx, store, pool, cutoff)
	require.NoError(t, err)
	require.Zero(t, dropped)
	require.Equal(t, before, testinfra.Partitions(t, pool, "inbox_messages"))

	require.NoError(t, older.Rollback(ctx))
	_, err = inbox.DropPartitionsBefore(ctx, store, pool, cutoff)
	require.NoError(t, err)
	for _, p := range testinfra.Partitions(t, pool, "inbox_messages") {
		require.True(t, p.To.After(cutoff), "partition %s ends by the cutoff", p.Name)
	}
}

// names are the partitions' names.
func names(parts []testinfra.PartitionRange) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}

// TestPartitionKeptForAHiddenSession: a cleaner whose role may not see when another role's
// sessions began (no pg_read_all_stats) keeps a partition whose range ended: such a session
// may have a transaction open since before. Granted pg_read_all_stats, it sees the
// transaction, and keeps the partition while the transaction is open; then drops it.
func TestPartitionKeptForAHiddenSession(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, store := partitionedInbox(t, inbox.Tables{Partition: time.Hour})
	cleaner, other := testinfra.UniqueName(t, "cleaner"), testinfra.UniqueName(t, "other")
	for _, role := range []string{cleaner, other} {
		_, err := pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx := context.Background()
			for _, stmt := range []string{"REASSIGN OWNED BY %s TO postgres", "DROP OWNED BY %s", "DROP ROLE %s"} {
				if _, err := pool.Exec(ctx, fmt.Sprintf(stmt, pgx.Identifier{role}.Sanitize())); err != nil {
					t.Errorf("drop role %s: %v", role, err)
					return
				}
			}
		})
	}
	// The cleaner's role owns the table and its partitions, as detaching them needs.
	_, err := pool.Exec(ctx, "ALTER TABLE inbox_messages OWNER TO "+pgx.Identifier{cleaner}.Sanitize())
	require.NoError(t, err)
	for _, p := range testinfra.Partitions(t, pool, "inbox_messages") {
		_, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s OWNER TO %s", pgx.Identifier{p.Name}.Sanitize(), pgx.Identifier{cleaner}.Sanitize()))
		require.NoError(t, err)
	}
	as := func(role string) *pgxpool.Pool {
		config := pool.Config().Copy()
		config.ConnConfig.User = role
		p, err := pgxpool.NewWithConfig(ctx, config)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	cleanerPool, otherPool := as(cleaner), as(other)

	hidden, err := otherPool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hidden.Rollback(context.Background()) }) // before its pool closes
	_, err = hidden.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	before := testinfra.Partitions(t, pool, "inbox_messages")
	cutoff := dbNow(t, pool).Add(2 * time.Hour)
	dropped, err := inbox.DropPartitionsBefore(ctx, store, cleanerPool, cutoff)
	require.NoError(t, err)
	require.Zero(t, dropped)
	require.Equal(t, before, testinfra.Partitions(t, pool, "inbox_messages"), "kept while the hidden session's transaction is open")

	// Its role may see when the sessions began: the transaction is newer than the partition.
	_, err = pool.Exec(ctx, "GRANT pg_read_all_stats TO "+pgx.Identifier{cleaner}.Sanitize())
	require.NoError(t, err)
	dropped, err = inbox.DropPartitionsBefore(ctx, store, cleanerPool, cutoff)
	require.NoError(t, err)
	require.Equal(t, before, testinfra.Partitions(t, pool, "inbox_messages"), "kept while the transaction is open")
	require.NoError(t, hidden.Rollback(ctx))
	_, err = inbox.DropPartitionsBefore(ctx, store, cleanerPool, cutoff)
	require.NoError(t, err)
	for _, p := range testinfra.Partitions(t, pool, "inbox_messages") {
		require.True(t, p.To.After(cutoff), "partition %s ends by the cutoff", p.Name)
	}
}

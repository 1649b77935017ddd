package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// heldPublisher holds the first batch it is given until release is closed: the relay's claim
// transaction stays open meanwhile.
type heldPublisher struct {
	outbox.Publisher
	once    sync.Once
	held    chan []uuid.UUID
	release chan struct{}
}

func (p *heldPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	first := false
	p.once.Do(func() { first = true })
	if first {
		p.held <- ids(msgs)
		<-p.release
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestFailover runs a relay on a multi-host URL (primary and synchronous standby,
// target_session_attrs=read-write) and fails the primary over while the relay holds a claim:
// the claim dies with the primary, so the claimed rows, and those committed meanwhile, are
// pending on the standby; while only the standby is up the relay reports the database
// unavailable and nothing writes; once the standby is promoted the relay publishes every
// row from it, listens on it again, and the pool keeps no connection to the dead server.
func TestFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "outbox_failover")
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	amqpURL := testinfra.AMQPURL(t)
	b := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(t, amqpURL), pub: newPublisher(t, amqpURL)}
	got := consume(t, amqpURL, b.top.Queue)

	pub := &heldPublisher{Publisher: b.pub, held: make(chan []uuid.UUID, 1), release: make(chan struct{})}
	var (
		mu      sync.Mutex
		outages []error
	)
	cfg := fastConfig(t)
	cfg.PublishTimeout = 30 * time.Second
	// Only notifications and the relay's own re-checks wake it: a poll would hide a LISTEN
	// that never came back.
	cfg.PollInterval = time.Hour
	cfg.Hooks.StateChanged = func(c outbox.StateChange) {
		if c.To == outbox.StateDatabaseUnavailable {
			mu.Lock()
			outages = append(outages, c.Err)
			mu.Unlock()
		}
	}
	relay := b.startRelay(t, pool, pub, cfg)

	var want []uuid.UUID
	for i := range 5 {
		want = append(want, ids(b.write(t, b.msg(fmt.Sprintf("claimed-%d", i), i)))...)
	}
	var claimed []uuid.UUID
	select {
	case claimed = <-pub.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay claimed nothing")
	}
	// Committed on the primary while the claim is open: the synchronous standby has them.
	for i := range 5 {
		want = append(want, ids(b.write(t, b.msg(fmt.Sprintf("meanwhile-%d", i), i)))...)
	}

	pair.KillPrimary(t)
	close(pub.release) // the batch reaches the broker; its marks cannot commit

	t.Run("OnlyTheStandby", func(t *testing.T) {
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return relay.State() == outbox.StateDatabaseUnavailable
		}, "the relay reports the database unavailable")
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, b.msg("refused", 0)) })
		require.Error(t, err, "no server takes writes")
		t.Logf("a write while only the standby is up: %v", err)
		mu.Lock()
		t.Logf("the relay's outage: %v", outages)
		mu.Unlock()

		pair.WaitReplayed(t)
		standby, err := pgx.Connect(ctx, pair.Standby.URL("outbox_failover"))
		require.NoError(t, err)
		defer standby.Close(ctx)
		var pending []uuid.UUID
		rows, err := standby.Query(ctx, "SELECT id FROM outbox_messages WHERE published_at IS NULL ORDER BY seq")
		require.NoError(t, err)
		pending, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(t, err)
		require.Equal(t, want, pending, "every committed row is on the standby, pending: the claim and its marks died with the primary")
		require.Subset(t, pending, claimed)
	})

	pair.Promote(t)

	t.Run("PublishedFromTheNewPrimary", func(t *testing.T) {
		testinfra.Eventually(t, 60*time.Second, func() bool {
			return b.count(t, "published_at IS NULL") == 0
		}, "every row published from the promoted standby")
		testinfra.Eventually(t, 30*time.Second, func() bool {
			seen := got.ids()
			return !slices.ContainsFunc(want, func(id uuid.UUID) bool { return seen[id.String()] == 0 })
		}, "every row reached the queue")
		for id, n := range got.ids() {
			if n > 1 {
				require.Contains(t, claimed, uuid.MustParse(id), "only the batch cut by the failover may be published twice")
			}
		}
		require.Equal(t, 0, b.count(t, "dead_at IS NOT NULL"))
	})

	t.Run("ListensOnTheNewPrimary", func(t *testing.T) {
		testinfra.Eventually(t, 30*time.Second, func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
			return err == nil && n == 1
		}, "the relay listens on the promoted standby")
		m := b.write(t, b.msg("after", 0))[0]
		testinfra.Eventually(t, 30*time.Second, func() bool { return got.ids()[m.ID.String()] == 1 },
			"a row written after the failover is published at its notification")
	})

	t.Run("NoConnectionToTheDeadServer", func(t *testing.T) {
		// The relay may hold every connection of the pool at the moment of asking (its
		// batches' claims, its maintenance; its LISTEN is out of the pool): ask again until
		// some are idle.
		var conns []*pgxpool.Conn
		testinfra.Eventually(t, 30*time.Second, func() bool {
			conns = pool.AcquireAllIdle(ctx)
			return len(conns) > 0
		}, "no connection of the pool became idle")
		defer func() {
			for _, c := range conns {
				c.Release()
			}
		}()
		for _, c := range conns {
			var port int
			require.NoError(t, c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
			require.Equal(t, pair.Standby.Port, port)
		}
	})
}

// TestWALRelayFailover kills the primary under a WAL relay and its writers, and promotes the
// synchronous standby: the slot stayed behind on the old primary (PostgreSQL 15), so the
// relay creates it again on the new one and the rows pending there go out through its retry
// lane. Every acknowledged row is published, each aggregate's in commit order, and nothing
// is published that the new primary does not have.
func TestWALRelayFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair := testinfra.StartLogicalPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "wal_failover")
	pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=12") // the relay's 2·4+2, and the writers
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	store, err := outbox.NewStore(outbox.Tables{})
	require.NoError(t, err)
	require.NoError(t, store.CreatePublication(ctx, pool, ""))
	amqpURL := testinfra.AMQPURL(t)
	b := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(t, amqpURL), pub: newPublisher(t, amqpURL)}
	got := consume(t, amqpURL, b.top.Queue)

	cfg := fastConfig(t)
	cfg.BatchSize = 10
	cfg.InFlightBatches = 4
	w, err := outbox.NewWALRelay(pool, b.pub, cfg, outbox.WALConfig{URL: dbURL, StatusInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-runErr })
	testinfra.Eventually(t, 30*time.Second, func() bool { return w.State() == outbox.StateRunning }, "the relay streams")

	// Four writers, one aggregate each, one row per transaction. A write whose commit fails
	// may or may not have committed (the primary died around it): only the acknowledged
	// rows must be published.
	const aggregates = 4
	var (
		mu       sync.Mutex
		acked    = map[string][]string{}
		total    int
		stopping = make(chan struct{})
		writers  sync.WaitGroup
	)
	for a := range aggregates {
		agg := fmt.Sprintf("agg-%d", a)
		writers.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stopping:
					return
				default:
				}
				m := []outbox.Message{b.msg(agg, n)}
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error { return outbox.Add(wctx, tx, m...) })
				cancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the failover: try the next row shortly
					continue
				}
				mu.Lock()
				acked[agg] = append(acked[agg], m[0].ID.String())
				total++
				mu.Unlock()
			}
		})
	}
	var stopOnce sync.Once
	stopWriters := func() { stopOnce.Do(func() { close(stopping) }); writers.Wait() }
	t.Cleanup(stopWriters) // also when the test fails before it stops them
	ackedNow := func() int { mu.Lock(); defer mu.Unlock(); return total }
	testinfra.Eventually(t, 30*time.Second, func() bool { return ackedNow() >= 200 && len(got.ids()) >= 100 },
		"rows written and published before the failover")

	pair.KillPrimary(t)
	pair.Promote(t)
	before := ackedNow()
	testinfra.Eventually(t, 60*time.Second, func() bool { return ackedNow() >= before+200 }, "rows written on the new primary")
	stopWriters()

	mu.Lock()
	defer mu.Unlock()
	testinfra.Eventually(t, 60*time.Second, func() bool {
		seen := got.ids()
		for _, ids := range acked {
			if slices.ContainsFunc(ids, func(id string) bool { return seen[id] == 0 }) {
				return false
			}
		}
		return true
	}, "every acknowledged row published")
	testinfra.Eventually(t, 30*time.Second, func() bool { return b.count(t, "published_at IS NULL") == 0 },
		"nothing pending on the new primary")
	require.Zero(t, b.count(t, "dead_at IS NOT NULL"))

	// Each aggregate's acknowledged rows, in the order of their first delivery, are in the
	// order they were written.
	first := map[string][]string{}
	isAcked := map[string]bool{}
	for _, ids := range acked {
		for _, id := range ids {
			isAcked[id] = true
		}
	}
	seen := map[string]bool{}
	for _, d := range got.all() {
		if seen[d.MessageId] || !isAcked[d.MessageId] {
			continue
		}
		seen[d.MessageId] = true
		agg, _ := d.Headers["aggregate_id"].(string)
		first[agg] = append(first[agg], d.MessageId)
	}
	require.Equal(t, acked, first, "each aggregate's rows in commit order")

	// Nothing published that the new primary does not hold: a row the old primary alone had
	// (its commit not on the standby) must not have gone out.
	rows, err := pool.Query(ctx, "SELECT id::text FROM outbox_messages")
	require.NoError(t, err)
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	inTable := map[string]bool{}
	for _, id := range held {
		inTable[id] = true
	}
	for id := range got.ids() {
		require.True(t, inTable[id], "published %s, which the new primary does not have", id)
	}
	dups := 0
	for _, n := range got.ids() {
		dups += n - 1
	}
	t.Logf("%d rows acknowledged, %d delivered, %d twice", total, len(got.ids()), dups)
	var slot bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", outbox.Tables{}.WALName()).Scan(&slot))
	require.True(t, slot, "the slot was created again on the new primary")
}

// TestWALRelayPublishesOnlyVisibleRows: the stream sends a commit once it is flushed on the
// primary, before the writer's transaction is visible to others (here: held by its wait
// for the synchronous standby to apply it, synchronous_commit = remote_apply, with the
// standby's replay paused). The relay publishes nothing of it until it is visible: a
// consumer's reply would otherwise reach the writer's service before the row it answers
// (an order unknown to its own service). A later transaction of another aggregate goes out
// meanwhile; a wait longer than the relay's bound is an outage of the database, not the
// message's; once visible, the row is published, once.
func TestWALRelayPublishesOnlyVisibleRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pair := testinfra.StartLogicalPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "wal_visible")
	pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=12")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	store, err := outbox.NewStore(outbox.Tables{})
	require.NoError(t, err)
	require.NoError(t, store.CreatePublication(ctx, pool, ""))
	amqpURL := testinfra.AMQPURL(t)
	b := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(t, amqpURL), pub: newPublisher(t, amqpURL)}
	got := consume(t, amqpURL, b.top.Queue)

	var (
		mu      sync.Mutex
		outages []error
	)
	cfg := fastConfig(t)
	cfg.BatchSize = 1 // the held row and the later one in batches of their own
	cfg.InFlightBatches = 4
	cfg.PublishTimeout = time.Second
	cfg.ClaimTimeout = 2 * time.Second // the relay's bound on a batch's barrier: 1s + 2·2s
	cfg.Hooks.StateChanged = func(c outbox.StateChange) {
		if c.To == outbox.StateDatabaseUnavailable {
			mu.Lock()
			outages = append(outages, c.Err)
			mu.Unlock()
		}
	}
	w, err := outbox.NewWALRelay(pool, b.pub, cfg, outbox.WALConfig{URL: dbURL, StatusInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-runErr })
	testinfra.Eventually(t, 30*time.Second, func() bool { return w.State() == outbox.StateRunning }, "the relay streams")

	standby, err := pgx.Connect(ctx, pair.Standby.URL("wal_visible"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Close(context.Background()) })
	_, err = standby.Exec(ctx, "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)
	resumed := false
	t.Cleanup(func() {
		if !resumed { // let the held writer end, or the pair's stop waits for it
			_, _ = standby.Exec(context.Background(), "SELECT pg_wal_replay_resume()")
		}
	})

	// The held row: committed in the WAL, streamed, invisible until the standby applies it.
	writer, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer writer.Release()
	_, err = writer.Exec(ctx, "SET synchronous_commit = remote_apply")
	require.NoError(t, err)
	writerPID := writer.Conn().PgConn().PID()
	held := b.msg("held", 0)
	held.ID = uuid.Must(uuid.NewV7()) // Add sets the id of its own copy only
	committed := make(chan error, 1)
	go func() {
		committed <- pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, held) })
	}()
	testinfra.Eventually(t, 10*time.Second, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT coalesce(bool_or(wait_event = 'SyncRep'), false) FROM pg_stat_activity WHERE pid = $1",
			writerPID).Scan(&waiting)
		return err == nil && waiting
	}, "the held writer waits for the standby, its commit flushed")

	// A later commit (the default synchronous_commit: the standby has flushed it) is
	// streamed after the held one, and goes out while the held one waits.
	later := b.write(t, b.msg("later", 0))
	testinfra.Eventually(t, 20*time.Second, func() bool { return got.ids()[later[0].ID.String()] > 0 }, "the later row is published")
	require.Zero(t, got.ids()[held.ID.String()], "a row was published before its transaction was visible")

	// Held past the relay's bound: the database is blamed, with what the writer waits for,
	// and the relay waits on in the same session (a new one would stream the commit again,
	// and wait again, and publish the later batches again).
	testinfra.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, err := range outages {
			if strings.Contains(err.Error(), "streamed transactions are still in progress") &&
				strings.Contains(err.Error(), fmt.Sprintf("pid %d (IPC: SyncRep", writerPID)) {
				return true
			}
		}
		return false
	}, "the relay blames the database for a transaction that stays invisible, naming its writer")
	require.Zero(t, got.ids()[held.ID.String()], "a row was published before its transaction was visible")
	select {
	case err := <-committed:
		t.Fatalf("the held writer committed with the standby's replay paused: %v", err)
	default:
	}

	_, err = standby.Exec(ctx, "SELECT pg_wal_replay_resume()")
	require.NoError(t, err)
	resumed = true
	require.NoError(t, <-committed)
	testinfra.Eventually(t, 30*time.Second, func() bool { return got.ids()[held.ID.String()] > 0 }, "the held row is published once visible")
	testinfra.Eventually(t, 30*time.Second, func() bool { return w.State() == outbox.StateRunning }, "the relay streams again")
	require.Equal(t, 1, got.ids()[held.ID.String()], "published once")
	require.Equal(t, 1, got.ids()[later[0].ID.String()], "the later row published once: the session never ended")
	testinfra.Eventually(t, 30*time.Second, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "nothing left pending")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, outages, 1, "one outage: the wait, blamed once")
}

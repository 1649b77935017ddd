package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// writeLocalOnly commits msg on the primary of a pair whose synchronous standby is down, so
// that it is on the primary alone: its COMMIT waits for the standby until an operator (here
// the test) cancels the wait with pg_cancel_backend, and PostgreSQL keeps the transaction,
// committed and visible, with a warning. (A client whose own deadline passes leaves the same
// row behind: pgx closes the connection, the server goes on waiting, and a crash-restart of
// the primary makes the row visible.) It returns msg's id.
func writeLocalOnly(t *testing.T, pool *pgxpool.Pool, msg outbox.Message) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Add(ctx, tx, msg))
	var id uuid.UUID
	require.NoError(t, tx.QueryRow(ctx, "SELECT id FROM outbox_messages ORDER BY seq DESC LIMIT 1").Scan(&id))
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx) }()
	testinfra.Eventually(t, waitFor, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')", pid).Scan(&waiting))
		return waiting
	}, "the commit waits for the standby")
	_, err = pool.Exec(ctx, "SELECT pg_cancel_backend($1)", pid)
	require.NoError(t, err)
	require.NoError(t, <-committed, "PostgreSQL answers a cancelled wait for the standby with success and a warning")
	var visible bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outbox_messages WHERE id = $1)", id).Scan(&visible))
	require.True(t, visible, "a commit whose wait was cancelled is visible on the primary")
	return id
}

// TestAcknowledgeOnlyReplicated runs a primary whose synchronous standby is down, and a row
// committed on the primary alone (its writer's wait for the standby cancelled): what a plain
// commit would acknowledge, CommitReplicated and the relay must not, until the standby has
// it; and a row the standby never got, lost in the failover, was never published.
func TestAcknowledgeOnlyReplicated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "outbox_replicated")
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	b := &bundle{pool: pool, top: testinfra.Topology{Exchange: "replicated.events", Queue: "unused"}}

	pair.KillStandby(t)
	first := writeLocalOnly(t, pool, b.msg("first", 1))
	exists := func(ctx context.Context, tx pgx.Tx, id uuid.UUID) bool {
		var ok bool
		require.NoError(t, tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outbox_messages WHERE id = $1)", id).Scan(&ok))
		return ok
	}

	// The hole: a transaction that only reads commits at once, and would confirm the row.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.True(t, exists(ctx, tx, first))
	require.NoError(t, tx.Commit(ctx), "a read-only commit waits for no standby")

	// CommitReplicated of the same read does not return success while the standby is down,
	// also in a session whose synchronous_commit waits for no standby.
	for _, syncCommit := range []string{"on", "local"} {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SELECT set_config('synchronous_commit', $1, false)", syncCommit)
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		tx, err := conn.Begin(rctx)
		require.NoError(t, err)
		require.True(t, exists(rctx, tx, first))
		err = outbox.CommitReplicated(rctx, tx)
		cancel()
		require.Error(t, err, "synchronous_commit %s: a read of a row on the primary alone confirmed", syncCommit)
		t.Logf("synchronous_commit %s: %v", syncCommit, err)
		_ = tx.Rollback(ctx)
		conn.Release()
	}

	// The relay claims the row and waits for the standby before it publishes: nothing is
	// published while the standby is down; the relay says the database is unavailable.
	pub := &recorder{}
	claims := make(chan struct{}, 100)
	cfg := fastConfig(t)
	cfg.PublishTimeout, cfg.ClaimTimeout = time.Second, 2*time.Second
	cfg.Hooks.Polled = func(p outbox.Poll) {
		if p.Claimed > 0 {
			select {
			case claims <- struct{}{}:
			default:
			}
		}
	}
	relay := b.startRelay(t, pool, pub, cfg)
	// waitClaims waits until the relay has claimed the row n times more, and fails as soon
	// as it publishes it.
	waitClaims := func(n int) {
		t.Helper()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(waitFor)
		for n > 0 {
			select {
			case <-claims:
				n--
			case <-tick.C:
			case <-deadline:
				t.Fatal("the relay did not claim the row")
			}
			require.Zero(t, pub.count(), "the relay published a row the standby does not have")
		}
	}
	waitClaims(3)
	testinfra.Eventually(t, waitFor, func() bool { return relay.State() == outbox.StateDatabaseUnavailable }, "the relay reports the database unavailable")

	// Once the standby is back it catches up, and the row goes out; so does a read confirmed
	// with CommitReplicated.
	pair.StartStandby(t)
	testinfra.Eventually(t, waitFor, func() bool { return pub.count() == 1 }, "published once the standby has it")
	require.Equal(t, first, pub.all()[0].ID)
	// Its mark commits once the standby has it too; only then is the standby taken away
	// again, or the row would be pending on the promoted standby below, and published a
	// second time (a duplicate the inbox absorbs, but not what this test counts).
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 1 }, "the row marked published")
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.True(t, exists(ctx, tx, first))
	require.NoError(t, outbox.CommitReplicated(ctx, tx))
	// On the hot standby itself, which writes no WAL, a read commits as it is.
	pair.WaitReplayed(t)
	standby, err := pgx.Connect(ctx, pair.Standby.URL("outbox_replicated"))
	require.NoError(t, err)
	tx, err = standby.Begin(ctx)
	require.NoError(t, err)
	require.True(t, exists(ctx, tx, first))
	require.NoError(t, outbox.CommitReplicated(ctx, tx), "on a standby")
	require.NoError(t, standby.Close(ctx))

	// A row the standby never gets is lost in a failover to it, and was never published.
	pair.KillStandby(t)
	published := pub.count()
	lost := writeLocalOnly(t, pool, b.msg("lost", 1))
	for range 2 {
		select {
		case <-claims:
		case <-time.After(waitFor):
			t.Fatal("the relay did not claim the row")
		}
	}
	require.Equal(t, published, pub.count(), "the relay published a row the standby does not have")
	isPublished := func(id uuid.UUID) bool {
		for _, m := range pub.all() {
			if m.ID == id {
				return true
			}
		}
		return false
	}
	pair.KillPrimary(t)
	pair.StartStandby(t)
	pair.Promote(t)
	testinfra.Eventually(t, waitFor, func() bool { return relay.State() == outbox.StateRunning }, "the relay runs on the promoted standby")
	require.False(t, isPublished(lost), "published a row the failover lost")
	require.Equal(t, 1, pub.count())
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages WHERE id = $1", lost).Scan(&n))
	require.Zero(t, n, "the row committed on the old primary alone is gone")

	// The promoted standby has no synchronous standby of its own: rows go out at once.
	after := b.write(t, b.msg("after", 1))[0]
	testinfra.Eventually(t, waitFor, func() bool { return isPublished(after.ID) }, "published on the new primary")
	require.False(t, isPublished(lost))
	require.NoError(t, outbox.CommitReplicated(ctx, mustBegin(t, pool)), "no standby to wait for")
}

func mustBegin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	return tx
}

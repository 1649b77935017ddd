package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// recordLocalOnly records msg as processed by consumer on the primary of a pair whose
// synchronous standby is down, so that the inbox row is on the primary alone: as a first
// delivery's commit that waited for the standby until its wait was cut short
// (pg_cancel_backend here; a crash-restart of the primary does the same to a commit whose
// client gave up). PostgreSQL keeps such a transaction, committed and visible, with a
// warning.
func recordLocalOnly(t *testing.T, pool *pgxpool.Pool, consumer string, msg inbox.Message) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO inbox_messages (consumer, message_id, message_type, received_at) VALUES ($1, $2, $3, now())", consumer, msg.ID, msg.Type)
	require.NoError(t, err)
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
	require.Equal(t, 1, countRows(t, pool, "SELECT count(*) FROM inbox_messages WHERE message_id = $1", msg.ID))
}

// waitFor bounds the waits of the test below for what the pair does in its own time.
const waitFor = 20 * time.Second

// TestDuplicateAcknowledgedOnlyReplicated runs a primary whose synchronous standby is down,
// and a message whose inbox row is on the primary alone. A redelivery finds the row, but
// Process must not report a duplicate (which its caller acknowledges) until the standby has
// the row; and when a failover loses the row, the message is applied on the new primary,
// once.
func TestDuplicateAcknowledgedOnlyReplicated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(t)
	pool, err := pgxpool.New(ctx, pair.CreateDatabase(t, "inbox_replicated"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, inbox.Migrate(ctx, pool))
	const consumer = "replicated"
	applied := map[string]int{}
	apply := func(ctx context.Context, tx pgx.Tx) error { return nil }
	process := func(timeout time.Duration, msg inbox.Message) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return inbox.Process(ctx, pool, consumer, msg, func(ctx context.Context, tx pgx.Tx) error {
			applied[msg.ID]++
			return apply(ctx, tx)
		})
	}

	pair.KillStandby(t)
	first := inbox.Message{ID: "first", Type: "TestEvent"}
	recordLocalOnly(t, pool, consumer, first)
	dup, err := process(time.Second, first)
	require.Error(t, err, "a duplicate on the primary alone reported (duplicate %v): its delivery would be acknowledged", dup)
	require.True(t, inbox.IsTransient(err), "not the message's fault: %v", err)
	t.Logf("the redelivery while the standby is down: %v", err)
	// Nor in a batch, in which nothing fails and the commit carries the barrier.
	batchCtx, cancel := context.WithTimeout(ctx, time.Second)
	results, err := inbox.ProcessBatch(batchCtx, pool, consumer, []inbox.Message{first}, nil)
	cancel()
	require.Error(t, err, "a batch's duplicate on the primary alone reported (results %v)", results)
	require.True(t, inbox.IsTransient(err), "not the message's fault: %v", err)

	// A message processed while the standby is down is not acknowledged either: its commit
	// waits for the standby until the deadline, and the outcome is unknown.
	second := inbox.Message{ID: "second", Type: "TestEvent"}
	_, err = process(time.Second, second)
	require.Error(t, err)
	require.Equal(t, 1, applied["second"])

	// Once the standby is back, the redeliveries are duplicates, confirmed.
	pair.StartStandby(t)
	for _, msg := range []inbox.Message{first, second} {
		dup, err := process(waitFor, msg)
		require.NoError(t, err)
		require.True(t, dup, "%s is a duplicate", msg.ID)
	}
	require.Zero(t, applied["first"])
	require.Equal(t, 1, applied["second"], "applied once")

	// A row the standby never got is lost in a failover to it: the message was never
	// acknowledged, so its redelivery applies it on the new primary, once.
	pair.KillStandby(t)
	lost := inbox.Message{ID: "lost", Type: "TestEvent"}
	recordLocalOnly(t, pool, consumer, lost)
	_, err = process(time.Second, lost)
	require.Error(t, err)
	pair.KillPrimary(t)
	pair.StartStandby(t)
	pair.Promote(t)
	testinfra.Eventually(t, waitFor, func() bool { // the pool finds the promoted standby
		dup, err = process(5*time.Second, lost)
		return err == nil
	}, "processed on the promoted standby")
	require.NoError(t, err)
	require.False(t, dup, "the inbox row was lost with the old primary")
	require.Equal(t, 1, applied["lost"])
}

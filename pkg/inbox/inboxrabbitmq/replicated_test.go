package inboxrabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestAcknowledgesOnlyReplicated runs a consumer on a primary whose synchronous standby is
// down. A message's commit waits for the standby; the primary crashes and restarts, which
// makes that commit visible on the primary alone; the retry of the held delivery finds its
// inbox row. The consumer must not acknowledge it as a duplicate while the standby lacks the
// row; and after a failover to the standby, which never got it, the message is applied
// there, once.
func TestAcknowledgesOnlyReplicated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(t)
	b := setupOn(t, pair.CreateDatabase(t, "inbox_replicated"))
	queue := b.quorumQueue(t, deliveryLimit)
	cfg := b.config(recordEffect)
	cfg.Queue = queue
	cfg.RetryBaseDelay = 20 * time.Millisecond
	cfg.RetryMaxDelay = 200 * time.Millisecond
	_, stop := b.start(t, b.pool, cfg)

	pair.KillStandby(t)
	b.publishTo(t, "", queue, jsonMessage("waiting"))
	primary, err := pgx.Connect(ctx, pair.Primary.URL("inbox_replicated"))
	require.NoError(t, err)
	testinfra.Eventually(t, 30*time.Second, func() bool {
		var waiting bool
		require.NoError(t, primary.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep')").Scan(&waiting))
		return waiting
	}, "the message's commit waits for the standby")
	_ = primary.Close(ctx)

	// The crash-restart replays the commit: the inbox row and the effect are visible, on the
	// primary alone.
	pair.RestartPrimary(t)
	testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "waiting") == 1 }, "the commit is visible after the restart")
	// The held delivery is retried meanwhile and finds its inbox row; a while of it must not
	// end in an acknowledgement. (The wait is the point: nothing must happen in it.)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		processed, duplicates := b.events.counts()
		require.Zero(t, processed+duplicates, "the message was acknowledged while the standby lacks its inbox row")
	}

	// The failover loses the row: the message is applied on the promoted standby, once.
	pair.KillPrimary(t)
	pair.StartStandby(t)
	pair.Promote(t)
	testinfra.Eventually(t, time.Minute, func() bool {
		processed, _ := b.events.counts()
		return processed == 1
	}, "the message was not processed on the promoted standby")
	stop()
	_, duplicates := b.events.counts()
	require.Zero(t, duplicates)
	require.Equal(t, 1, b.effects(t, "waiting"), "applied once on the new primary")
	require.Empty(t, b.events.deadReasons())
}

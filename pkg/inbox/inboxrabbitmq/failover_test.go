package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestFailover runs a consumer on a multi-host URL (primary and synchronous standby,
// target_session_attrs=read-write) and fails the primary over while a handler's transaction
// is open: that transaction dies with the primary and is retried in place until the promoted
// standby takes it; the messages processed before the failover are on the standby (their
// inbox rows too, so a redelivery of one is skipped there); every message is applied once,
// nothing is dead-lettered, and no delivery is used up.
func TestFailover(t *testing.T) {
	t.Parallel()
	const before, during = 10, 10
	pair := testinfra.StartPostgresPair(t)
	b := setupOn(t, pair.CreateDatabase(t, "inbox_failover"))
	queue := b.quorumQueue(t, deliveryLimit)

	// The held message's first attempt waits in its transaction for the kill; the retries
	// go through. (A non-blocking send here lost the race when the handler came before the
	// test's receive, and the first attempt was not held.)
	var heldOnce atomic.Bool
	inHandler := make(chan struct{}, 1)
	release := make(chan struct{})
	cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
		if d.ID == "held" && heldOnce.CompareAndSwap(false, true) {
			inHandler <- struct{}{}
			<-release
		}
		return recordEffect(ctx, tx, d)
	})
	cfg.Queue = queue
	cfg.RetryBaseDelay = 20 * time.Millisecond
	cfg.RetryMaxDelay = 200 * time.Millisecond
	c, stop := b.start(t, b.pool, cfg)

	for i := range before {
		b.publishTo(t, "", queue, jsonMessage(fmt.Sprintf("before-%d", i)))
	}
	testinfra.Eventually(t, time.Minute, func() bool {
		processed, _ := b.events.counts()
		return processed == before
	}, "the messages before the failover were not processed")

	b.publishTo(t, "", queue, jsonMessage("held"))
	select {
	case <-inHandler:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never got the held message")
	}
	pair.KillPrimary(t)
	close(release) // its transaction cannot commit: the primary is gone
	for i := range during {
		b.publishTo(t, "", queue, jsonMessage(fmt.Sprintf("during-%d", i)))
	}
	testinfra.Eventually(t, 30*time.Second, func() bool { return len(b.events.errors()) > 0 },
		"no handler failed while only the standby was up")
	t.Logf("while only the standby is up: %v", b.events.errors()[0])
	processed, _ := b.events.counts()
	require.Equal(t, before, processed, "nothing is processed while no server takes writes")

	pair.Promote(t)
	// The pool is the bundle's, on the multi-host URL: it follows the promotion too.
	testinfra.Eventually(t, time.Minute, func() bool {
		processed, _ := b.events.counts()
		return processed == before+1+during
	}, "not every message was processed after the promotion")

	// A message processed before the failover, delivered again: its inbox row is on the
	// promoted standby.
	b.publishTo(t, "", queue, jsonMessage("before-0"))
	testinfra.Eventually(t, 30*time.Second, func() bool {
		_, duplicates := b.events.counts()
		return duplicates == 1
	}, "the redelivery of a message processed before the failover was not skipped")
	stop()

	var port int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT inet_server_port()").Scan(&port))
	require.Equal(t, pair.Standby.Port, port)
	for _, id := range append(ids("before", before), append(ids("during", during), "held")...) {
		require.Equal(t, 1, b.effects(t, id), id)
	}
	require.Empty(t, b.events.deadReasons())
	require.Empty(t, b.events.retries(), "a failover used up an attempt")
	require.NotContains(t, b.events.handedBack(), inboxrabbitmq.HandBackRequeued)
	deadMessages, _ := b.queueState(t, b.dead.Queue)
	require.Zero(t, deadMessages)
	require.Equal(t, 0, c.Status().Held)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

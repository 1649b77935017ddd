package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// deliveryLimit is the quorum queues' x-delivery-limit in these tests: the broker
// dead-letters a message it delivered more than that many times again.
const deliveryLimit = 3

// countingHandler records the effect of every message, and the highest x-delivery-count
// (the quorum queue's count of earlier deliveries) it saw.
type countingHandler struct {
	mu       sync.Mutex
	maxCount int
}

func (h *countingHandler) handle(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
	h.mu.Lock()
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		h.maxCount = max(h.maxCount, int(n))
	case int32:
		h.maxCount = max(h.maxCount, int(n))
	case nil:
	default:
		h.maxCount = max(h.maxCount, 1000) // unexpected: fail the test's check
	}
	h.mu.Unlock()
	return recordEffect(ctx, tx, d)
}

func (h *countingHandler) max() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxCount
}

// TestDatabaseOutage takes the database away from a consumer of a quorum queue whose
// delivery limit is 3, for much longer than that many retry delays. Before, every failed
// attempt was a requeue, which the broker counts: it dead-lettered healthy messages after
// three. Now the consumer holds each delivery and retries in place, or hands it back by a
// republish the broker does not count: every message is processed exactly once, nothing
// is dead-lettered, and the broker never redelivers.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	const (
		messages = 20
		prefetch = 8 // b.config's
	)
	for _, tc := range []struct {
		name    string
		maxHold time.Duration
		// outageOver reports when the outage has lasted long enough.
		outageOver func(b *bundle, c *inboxrabbitmq.Consumer) bool
	}{
		{
			// Held all along: every delivery in hand fails at least three times the delivery
			// limit's worth of attempts in place.
			name: "HeldInPlace",
			outageOver: func(b *bundle, c *inboxrabbitmq.Consumer) bool {
				b.events.mu.Lock()
				defer b.events.mu.Unlock()
				return c.Status().Held == prefetch && b.events.handlerErrs >= prefetch*3*(deliveryLimit+1)
			},
		},
		{
			// Held for at most MaxHold, then handed back: every message goes round more
			// often than the delivery limit allows.
			name:    "HandedBackAtMaxHold",
			maxHold: 300 * time.Millisecond,
			outageOver: func(b *bundle, _ *inboxrabbitmq.Consumer) bool {
				n := 0
				for _, r := range b.events.handedBack() {
					if r == inboxrabbitmq.HandBackHoldLimit {
						n++
					}
				}
				return n >= messages*(deliveryLimit+1)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			queue := b.quorumQueue(t, deliveryLimit)
			pool, proxy := b.proxiedPool(t)
			h := &countingHandler{}
			cfg := b.config(h.handle)
			cfg.Queue = queue
			cfg.RetryBaseDelay = 20 * time.Millisecond
			cfg.RetryMaxDelay = 100 * time.Millisecond
			cfg.MaxHold = tc.maxHold

			proxy.Cut()
			outageStart := time.Now()
			c, stop := b.start(t, pool, cfg)
			for i := range messages {
				b.publishTo(t, "", queue, jsonMessage(fmt.Sprintf("order-%d", i)))
			}
			testinfra.Eventually(t, time.Minute, func() bool { return tc.outageOver(b, c) },
				"the outage did not last long enough")
			outage := time.Since(outageStart)
			require.Greater(t, outage, 3*cfg.RetryMaxDelay)
			require.Empty(t, b.events.deadReasons(), "dead-lettered during the outage")
			deadMessages, _ := b.queueState(t, b.dead.Queue)
			require.Zero(t, deadMessages, "the broker dead-lettered during the outage")
			t.Logf("database unreachable for %s; %d failed attempts, %d hand-backs", outage.Round(time.Millisecond),
				len(b.events.errors()), len(b.events.handedBack()))

			proxy.Heal()
			testinfra.Eventually(t, time.Minute, func() bool {
				processed, _ := b.events.counts()
				return processed == messages
			}, "not every message was processed after the outage")
			stop()

			for i := range messages {
				require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)), "order-%d", i)
			}
			_, duplicates := b.events.counts()
			require.Zero(t, duplicates)
			require.Empty(t, b.events.deadReasons())
			require.Empty(t, b.events.retries(), "a transient failure used up an attempt")
			require.NotContains(t, b.events.handedBack(), inboxrabbitmq.HandBackRequeued)
			require.Zero(t, h.max(), "the broker redelivered a message: it counted a delivery")
			readyMessages, _ := b.queueState(t, queue)
			require.Zero(t, readyMessages)
			deadMessages, _ = b.queueState(t, b.dead.Queue)
			require.Zero(t, deadMessages, "the dead-letter queue is not empty")
			now, _ := b.events.heldNow()
			require.Zero(t, now)
			require.Zero(t, c.Status().Held)
		})
	}

	// Stopping ends a hold at once and hands the delivery back uncounted: restarting more
	// often than the delivery limit during an outage dead-letters nothing.
	t.Run("StopWhileHoldingHandsBackUncounted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		t.Cleanup(func() {
			if t.Failed() {
				b.logs.dump(t)
			}
		})
		queue := b.quorumQueue(t, deliveryLimit)
		pool, proxy := b.proxiedPool(t)
		h := &countingHandler{}
		cfg := b.config(h.handle)
		cfg.Queue = queue
		cfg.ShutdownTimeout = 20 * time.Second

		proxy.Cut()
		b.publishTo(t, "", queue, jsonMessage("order-1"))
		const restarts = deliveryLimit + 2
		for i := range restarts {
			_, stop := b.start(t, pool, cfg)
			testinfra.Eventually(t, 20*time.Second, func() bool {
				now, _ := b.events.heldNow()
				return now == 1
			}, "start %d: the message was not held", i)
			began := time.Now()
			stop()
			require.Less(t, time.Since(began), 5*time.Second, "the stop waited for the held delivery")
			testinfra.Eventually(t, 10*time.Second, func() bool {
				messages, _ := b.queueState(t, queue)
				return messages == 1
			}, "start %d: the message is not back in the queue", i)
		}
		handBacks := b.events.handedBack()
		require.Len(t, handBacks, restarts)
		for _, r := range handBacks {
			require.Equal(t, inboxrabbitmq.HandBackShutdown, r)
		}

		proxy.Heal()
		b.start(t, pool, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1
		}, "not processed once the database came back")
		require.Equal(t, 1, b.effects(t, "order-1"))
		require.Zero(t, h.max(), "the broker counted a delivery")
		deadMessages, _ := b.queueState(t, b.dead.Queue)
		require.Zero(t, deadMessages)
	})
}

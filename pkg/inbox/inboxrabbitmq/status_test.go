package inboxrabbitmq_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestConsumerStatus(t *testing.T) {
	t.Parallel()

	// Ready turns into an error once the consumer has been disconnected for longer than the
	// bound, and back once it consumes again.
	t.Run("ReadyFollowsTheBrokerConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		cfg := b.config(recordEffect)
		cfg.URL = proxy.RewriteURL(t, b.amqpURL)
		c, err := inboxrabbitmq.NewConsumer(b.pool, cfg)
		require.NoError(t, err)
		require.ErrorContains(t, c.Ready(time.Hour), "not running")

		c, stop := b.start(t, b.pool, cfg)
		b.events.waitConnected(t, true)
		require.NoError(t, c.Ready(0))
		require.True(t, c.Connected())
		st := c.Status()
		require.True(t, st.Running)
		require.NoError(t, st.LastError)
		require.WithinDuration(t, time.Now(), st.Since, time.Minute)

		proxy.Cut()
		b.events.waitConnected(t, false)
		lost := time.Now()
		require.False(t, c.Connected())
		require.NoError(t, c.Ready(time.Hour), "a short disconnection is not unreadiness")
		const bound = 300 * time.Millisecond
		testinfra.Eventually(t, 10*time.Second, func() bool { return c.Ready(bound) != nil }, "still ready while disconnected")
		require.GreaterOrEqual(t, time.Since(lost), bound)
		err = c.Ready(bound)
		require.ErrorContains(t, err, "not connected to the broker for")
		st = c.Status()
		require.False(t, st.Connected)
		require.Error(t, st.LastError)
		require.ErrorIs(t, err, st.LastError)

		proxy.Heal()
		b.events.waitConnected(t, true)
		require.NoError(t, c.Ready(bound))
		stop()
		require.ErrorContains(t, c.Ready(time.Hour), "not running")
	})

	// A queue that exists with another delivery limit than Setup declares does not stop the
	// consumer: it warns once and consumes the queue as it is.
	t.Run("SetupToleratesOtherQueueArguments", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		queue := b.quorumQueue(t, 3)
		proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		cfg := b.config(recordEffect)
		cfg.URL = proxy.RewriteURL(t, b.amqpURL)
		cfg.Queue = queue
		cfg.Setup = func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
				"x-queue-type":              "quorum",
				"x-delivery-limit":          20, // changed in the configuration
				"x-dead-letter-exchange":    b.dead.Exchange,
				"x-dead-letter-routing-key": "dead",
			})
			return err
		}
		c, _ := b.start(t, b.pool, cfg)
		b.events.waitConnected(t, true)
		b.publishTo(t, "", queue, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "order-1") == 1 }, "not consumed")
		require.NoError(t, c.Ready(0))
		warning := c.Status().SetupWarning
		require.ErrorContains(t, warning, "inequivalent arg 'x-delivery-limit'")

		// On a reconnect the same warning is logged at debug level only.
		proxy.Cut()
		b.events.waitConnected(t, false)
		proxy.Heal()
		b.events.waitConnected(t, true)
		const msg = "topology exists with other arguments than Setup declares; consuming the existing queue as it is " +
			"(declarations after the failed one were skipped; change queue arguments through a policy, or recreate the queue)"
		logged := b.logs.find(msg)
		require.Len(t, logged, 2)
		require.Equal(t, "WARN", logged[0].level.String())
		require.Equal(t, "DEBUG", logged[1].level.String())
	})

	t.Run("SetupFailsForAMissingQueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(recordEffect)
		cfg.Queue = testinfra.UniqueName(t, "missing")
		cfg.Setup = func(ch *amqp.Channel) error {
			// Mismatching arguments on the dead-letter queue, and the consumed queue is gone.
			_, err := ch.QueueDeclare(b.dead.Queue, true, false, false, false, amqp.Table{"x-max-length": 10})
			return err
		}
		c, _ := b.start(t, b.pool, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return len(b.logs.find("rabbitmq consumer: broker connection: failing; retrying with backoff")) == 1
		}, "the consumer did not report the missing queue")
		st := c.Status()
		require.False(t, st.Connected)
		require.ErrorContains(t, st.LastError, "the queue cannot be consumed as it is")
		require.ErrorContains(t, st.LastError, "NOT_FOUND")
	})
}

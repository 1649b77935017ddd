package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestConsumerCluster consumes a quorum queue replicated on a private three-node cluster and
// SIGKILLs the node the consumer is connected to while messages flow: the consumer resumes
// through another node, and every message is applied exactly once (the ones in hand at the
// kill come back, as redeliveries or duplicates the inbox skips).
func TestConsumerCluster(t *testing.T) {
	t.Parallel()
	const messages = 600
	b := setup(t) // the database, and the shared broker for the test's own dead letters
	cluster := testinfra.SharedRabbitCluster(t)
	queue, dead := testinfra.UniqueName(t, "qq"), testinfra.UniqueName(t, "dead")
	setupTopology := func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(dead, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}

	cfg := b.config(recordEffect)
	cfg.URL, cfg.URLs = "", cluster.URLs()
	cfg.Queue, cfg.DeadLetterExchange, cfg.DeadLetterRoutingKey = queue, "", dead
	cfg.Setup = setupTopology
	c, _ := b.start(t, b.pool, cfg)
	b.events.waitConnected(t, true)
	first := cluster.Node(c.Status().Broker)
	require.NotNil(t, first, "consuming from %s, not a node of the cluster", c.Status().Broker)

	// The messages go in through another node, one that stays up.
	var other *testinfra.RabbitNode
	for _, n := range cluster.Nodes {
		if n != first {
			other = n
			break
		}
	}
	conn, err := amqp.Dial(other.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	require.NoError(t, setupTopology(ch))
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, jsonMessage(fmt.Sprintf("m-%04d", i)))
			require.NoError(t, err)
			ok, err := dc.WaitContext(context.Background())
			require.NoError(t, err)
			require.True(t, ok, "message %d nacked", i)
		}
	}
	processed := func() int { p, _ := b.events.counts(); return p }

	publish(0, messages/2)
	testinfra.Eventually(t, 60*time.Second, func() bool { return processed() >= messages/4 }, "a quarter processed")
	killed := time.Now()
	first.Kill(t)
	b.events.waitConnected(t, false)
	b.events.waitConnected(t, true)
	t.Logf("consuming again through %s %s after the kill of %s", c.Status().Broker, time.Since(killed).Round(time.Millisecond), first.Name)
	require.NotEqual(t, first.Addr(), c.Status().Broker)
	publish(messages/2, messages)
	testinfra.Eventually(t, 90*time.Second, func() bool { return processed() == messages }, "every message processed")
	for i := range messages {
		require.Equal(t, 1, b.effects(t, fmt.Sprintf("m-%04d", i)), "message %d", i)
	}
	_, duplicates := b.events.counts()
	t.Logf("%d messages applied once each; %d duplicates skipped by the inbox", messages, duplicates)
	require.Empty(t, b.events.deadReasons())
	for _, q := range []string{queue, dead} {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}

	// The next test of this binary finds three nodes running.
	first.Restart(t)
}

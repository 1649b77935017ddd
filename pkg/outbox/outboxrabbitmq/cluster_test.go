package outboxrabbitmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestPublisherCluster publishes into a quorum queue replicated on a private three-node
// cluster and SIGKILLs the node the publisher is connected to, which also leads the queue
// (declared through it): the publisher reports the batch in flight unavailable or refused,
// never published, then gets its confirms through another node, and every message it
// reported published is in the queue. A list whose first node is dead connects to the next.
func TestPublisherCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cluster := testinfra.SharedRabbitCluster(t)
	t.Logf("cluster of %d nodes running after %s", len(cluster.Nodes), time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	exchange, queue := testinfra.UniqueName(t, "ex"), testinfra.UniqueName(t, "qq")

	var (
		mu      sync.Mutex
		brokers []string // each broker the publisher connected to, in order
	)
	connectedTo := func() string {
		mu.Lock()
		defer mu.Unlock()
		return brokers[len(brokers)-1]
	}
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URLs: cluster.URLs(),
		// Declared through the publisher's first node, which then leads the queue (RabbitMQ's
		// client-local leader locator).
		Setup: func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				return err
			}
			return ch.QueueBind(queue, "#", exchange, false, nil)
		},
		DialTimeout: 5 * time.Second,
		Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
			if c.Up {
				mu.Lock()
				brokers = append(brokers, c.Broker)
				mu.Unlock()
			}
		}},
	})
	require.NoError(t, err)
	defer pub.Close()

	// publish publishes n new messages as a relay does: a message whose publish failed is
	// sent again with the next batch, after a short pause. It returns the errors seen, and
	// calls at once when confirmed reaches at.
	confirmed := map[string]bool{}
	var longestStall time.Duration // the longest time without a confirm
	publish := func(n int, at int, call func()) (failures []error) {
		var pending []outbox.Message
		lastConfirm := time.Now()
		for len(confirmed) < n || len(pending) > 0 {
			for len(pending) < 100 && len(confirmed)+len(pending) < n {
				pending = append(pending, message(exchange))
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			errs := pub.Publish(pctx, pending)
			cancel()
			var again []outbox.Message
			for i, err := range errs {
				switch {
				case err == nil:
					confirmed[pending[i].ID.String()] = true
					longestStall = max(longestStall, time.Since(lastConfirm))
					lastConfirm = time.Now()
					if len(confirmed) == at {
						go call()
					}
				case errors.Is(err, outbox.ErrUnavailable), errors.Is(err, outbox.ErrRefused), errors.Is(err, outbox.ErrNotSent):
					failures = append(failures, err)
					again = append(again, pending[i])
				default:
					t.Fatalf("message %s: %v", pending[i].ID, err)
				}
			}
			pending = again
			if len(again) > 0 {
				time.Sleep(200 * time.Millisecond) // the relay's backoff after an outage, shortened
			}
			// A new leader is elected within seconds; a busy machine may take longer.
			if stall := time.Since(lastConfirm); stall > 90*time.Second {
				t.Fatalf("no confirm for %s: %v", stall.Round(time.Millisecond), failures[len(failures)-1])
			}
		}
		return failures
	}

	require.Empty(t, publish(500, 0, nil))
	first := cluster.Node(connectedTo())
	require.NotNil(t, first, "connected to %s, not a node of the cluster", connectedTo())
	leader := cluster.Leader(t, queue, nil)
	t.Logf("publisher on %s; queue led by %s", first.Name, leader.Name)

	// The node dies while batches are in flight.
	var killed time.Time
	killedDone := make(chan struct{})
	failures := publish(4000, 1000, func() {
		defer close(killedDone)
		killed = time.Now()
		first.Kill(t)
	})
	<-killedDone
	var nacked int
	for _, err := range failures {
		if errors.Is(err, outbox.ErrRefused) {
			nacked++
		}
	}
	t.Logf("the kill cost %d failed publishes (%d nacked, the others unavailable; none reported published); confirms then came "+
		"through %s; longest time without a confirm %s; 4000 confirmed %s after the kill",
		len(failures), nacked, connectedTo(), longestStall.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	second := cluster.Node(connectedTo())
	require.NotNil(t, second)
	require.NotEqual(t, first, second, "the publisher moved to another node")

	// Every message reported published is in the queue (more, when a batch cut by the kill
	// reached the queue without its confirm: at least once).
	conn, err := amqp.Dial(second.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(500, 0, false))
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.GreaterOrEqual(t, q.Messages, len(confirmed))
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	seen := map[string]bool{}
	timeout := time.After(60 * time.Second)
	for range q.Messages {
		select {
		case d := <-deliveries:
			seen[d.MessageId] = true
		case <-timeout:
			t.Fatalf("consumed %d of %d messages", len(seen), q.Messages)
		}
	}
	lost := 0
	for id := range confirmed {
		if !seen[id] {
			lost++
		}
	}
	require.Zero(t, lost, "messages confirmed and not in the queue")
	_, err = ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)

	t.Run("DeadFirstNode", func(t *testing.T) {
		// first is still down: a list that starts with it connects to the next.
		p, err := outboxrabbitmq.New(outboxrabbitmq.Config{URLs: []string{first.URL, second.URL}, Setup: func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil)
		}})
		require.NoError(t, err)
		defer p.Close()
		for range 2 { // whichever node's turn came first, each call reaches the live one
			err := p.Publish(ctx, []outbox.Message{message(exchange)})[0]
			require.ErrorIs(t, err, outboxrabbitmq.ErrUnroutable, "published through the live node (no queue is bound any more)")
		}
	})

	// The next test of this binary finds three nodes running.
	first.Restart(t)
	testinfra.DeleteExchangeAtCleanup(t, second.URL, exchange)
}

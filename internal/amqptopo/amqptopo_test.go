package amqptopo_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

type bundle struct {
	url  string
	top  amqptopo.Topology
	ch   *amqp.Channel
	logs *logBuffer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{url: testinfra.AMQPURL(t), logs: &logBuffer{}, top: amqptopo.Topology{
		Exchange:           testinfra.UniqueName(t, "ex"),
		DeadLetterExchange: testinfra.UniqueName(t, "dlx"),
		Queue:              testinfra.UniqueName(t, "q"),
		RoutingKeys:        []string{"a.created", "a.cancelled"},
		DeadLetterQueue:    testinfra.UniqueName(t, "dlq"),
		DeliveryLimit:      5,
	}}
	conn, err := amqp.Dial(b.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, q := range []string{b.top.Queue, b.top.DeadLetterQueue} {
			_, _ = b.ch.QueueDelete(q, false, false, false)
		}
		for _, e := range []string{b.top.Exchange, b.top.DeadLetterExchange} {
			_ = b.ch.ExchangeDelete(e, false, false)
		}
	})
	return b
}

func (b *bundle) declarer(t *testing.T, top amqptopo.Topology) *amqptopo.Declarer {
	t.Helper()
	d, err := amqptopo.NewDeclarer([]string{b.url}, nil, top, slog.New(slog.NewTextHandler(b.logs, nil)))
	require.NoError(t, err)
	return d
}

// publish publishes a persistent message and waits for the broker's confirm; it fails the
// test when the message is unroutable.
func (b *bundle) publish(t *testing.T, exchange, key string) {
	t.Helper()
	conn, err := amqp.Dial(b.url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	c, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, amqp.Publishing{Body: []byte(`{}`), DeliveryMode: amqp.Persistent})
	require.NoError(t, err)
	require.True(t, c.Wait())
	select {
	case r := <-returns:
		t.Fatalf("unroutable: %s %s", r.Exchange, r.RoutingKey)
	default:
	}
}

func (b *bundle) messages(t *testing.T, queue string) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func TestDeclarer(t *testing.T) {
	t.Parallel()

	t.Run("declares the topology, again and again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.declarer(t, b.top)
		for range 2 {
			require.NoError(t, d.Declare(context.Background()))
		}
		for _, key := range b.top.RoutingKeys {
			b.publish(t, b.top.Exchange, key)
		}
		b.publish(t, b.top.DeadLetterExchange, b.top.Queue)
		require.Equal(t, 2, b.messages(t, b.top.Queue))
		require.Equal(t, 1, b.messages(t, b.top.DeadLetterQueue))
		// The queue has the configured arguments: declaring it with them again is accepted.
		_, err := b.ch.QueueDeclare(b.top.Queue, true, false, false, false, b.top.QueueArgs())
		require.NoError(t, err)
		require.Zero(t, b.logs.count("level=WARN"))
	})

	t.Run("keeps a queue declared with another delivery limit, with one warning", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := b.top
		old.DeliveryLimit = 20
		require.NoError(t, old.Declare(b.ch))
		b.publish(t, b.top.Exchange, b.top.RoutingKeys[0])

		d := b.declarer(t, b.top) // DeliveryLimit 5
		for range 3 {
			require.NoError(t, d.Declare(context.Background()), "a changed setting never stops the service")
			require.NoError(t, d.Setup(nil))
		}
		require.Equal(t, 1, b.logs.count("queue exists with other arguments than configured"), "one warning per process")
		require.Equal(t, 1, b.messages(t, b.top.Queue), "the queue and what it holds are kept")
		_, err := b.ch.QueueDeclare(b.top.Queue, true, false, false, false, old.QueueArgs())
		require.NoError(t, err, "the queue still has its first arguments")
	})

	t.Run("keeps a dead-letter queue that has a delivery limit, with a warning", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.ch.QueueDeclare(b.top.DeadLetterQueue, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum, amqptopo.ArgDeliveryLimit: int64(20),
		})
		require.NoError(t, err)
		require.NoError(t, b.declarer(t, b.top).Declare(context.Background()))
		require.Equal(t, 1, b.logs.count("dead-letter queue exists with other arguments"))
		b.publish(t, b.top.DeadLetterExchange, b.top.Queue)
	})

	t.Run("fails when the broker cannot be reached", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		u, err := url.Parse(b.url)
		require.NoError(t, err)
		proxy := testinfra.NewProxy(t, u.Host)
		proxy.Cut()
		d, err := amqptopo.NewDeclarer([]string{proxy.RewriteURL(t, b.url)}, nil, b.top, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.Error(t, d.Declare(ctx))
	})
}

// TestDeadLetterQueueKeepsWhatItHolds peeks a dead letter 25 times with a requeue, as the
// management UI's "get messages" does: it is still there, where a quorum queue with the
// delivery limit 20 would have dropped it.
func TestDeadLetterQueueKeepsWhatItHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.declarer(t, b.top).Declare(context.Background()))
	b.publish(t, b.top.DeadLetterExchange, b.top.Queue)
	for i := range 25 {
		var (
			d  amqp.Delivery
			ok bool
		)
		testinfra.Eventually(t, 10*time.Second, func() bool {
			var err error
			d, ok, err = b.ch.Get(b.top.DeadLetterQueue, false)
			require.NoError(t, err)
			return ok
		}, "dead letter gone after %d peeks", i)
		require.NoError(t, d.Nack(false, true))
	}
	testinfra.Eventually(t, 10*time.Second, func() bool { return b.messages(t, b.top.DeadLetterQueue) == 1 },
		"the dead letter is still in its queue after 25 peeks")
}

func TestDeadLetterQueueArgs(t *testing.T) {
	t.Parallel()
	top := amqptopo.DefaultNames("svc.q").Topology()
	require.Equal(t, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}, top.DeadLetterQueueArgs(3))
	require.Equal(t, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, amqptopo.ArgDeliveryLimit: int64(-1)}, top.DeadLetterQueueArgs(4))
}

// TestReplicas checks that a replica count is declared on both queues, and that 0 leaves it to
// the broker.
func TestReplicas(t *testing.T) {
	t.Parallel()
	top := amqptopo.DefaultNames("svc.q").Topology()
	require.NotContains(t, top.QueueArgs(), amqptopo.ArgQuorumInitialGroupSize)
	top.Replicas = 3
	require.Equal(t, int64(3), top.QueueArgs()[amqptopo.ArgQuorumInitialGroupSize])
	require.Equal(t, int64(3), top.DeadLetterQueueArgs(3)[amqptopo.ArgQuorumInitialGroupSize])
	require.NoError(t, top.Validate())
	top.Replicas = -1
	require.ErrorContains(t, top.Validate(), "replicas must be positive")
	require.Equal(t, 3, amqptopo.Names{}.WithDefaults(amqptopo.Names{Replicas: 3}).Replicas)
}

// TestDeclarerURLs checks that a Declarer given several brokers declares through a live one
// when the others are dead, whichever one's turn it is.
func TestDeclarerURLs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	dead := testinfra.NewProxy(t, u.Host)
	dead.Cut()
	d, err := amqptopo.NewDeclarer([]string{dead.RewriteURL(t, b.url), b.url, dead.RewriteURL(t, b.url)}, nil, b.top, nil)
	require.NoError(t, err)
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, d.Declare(ctx))
		cancel()
	}
	_, err = amqptopo.NewDeclarer([]string{b.url, "amqp://u:s3cret@h:port/"}, nil, b.top, nil)
	require.ErrorContains(t, err, "broker url 2")
	require.NotContains(t, err.Error(), "s3cret")
}

func TestNames(t *testing.T) {
	t.Parallel()

	t.Run("DefaultNames", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, amqptopo.Names{
			Exchange: "shop.events", DeadLetterExchange: "shop.dlx",
			Queue: "svc.q", DeadLetterQueue: "svc.q.dead", DeliveryLimit: 20,
		}, amqptopo.DefaultNames("svc.q"))
	})

	t.Run("WithDefaultsFillsOnlyZeroFields", func(t *testing.T) {
		t.Parallel()
		n := amqptopo.Names{Queue: "mine", DeliveryLimit: 3}.WithDefaults(amqptopo.DefaultNames("svc.q"))
		require.Equal(t, amqptopo.Names{
			Exchange: "shop.events", DeadLetterExchange: "shop.dlx",
			Queue: "mine", DeadLetterQueue: "svc.q.dead", DeliveryLimit: 3,
		}, n)
	})

	t.Run("Topology", func(t *testing.T) {
		t.Parallel()
		top := amqptopo.DefaultNames("svc.q").Topology("a.b", "c.d")
		require.Equal(t, []string{"a.b", "c.d"}, top.RoutingKeys)
		require.Equal(t, "svc.q.dead", top.DeadLetterQueue)
		require.NoError(t, top.Validate())
		require.Error(t, amqptopo.Names{}.Topology().Validate())
	})
}

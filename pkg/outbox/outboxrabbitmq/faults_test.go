package outboxrabbitmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// countingPublisher returns a publisher of url that counts its connects.
func countingPublisher(t *testing.T, cfg outboxrabbitmq.Config) (*outboxrabbitmq.Publisher, *atomic.Int32) {
	t.Helper()
	var connects atomic.Int32
	cfg.Hooks.Connected = func(c outboxrabbitmq.ConnectionChange) {
		if c.Up {
			connects.Add(1)
		}
	}
	pub, err := outboxrabbitmq.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub, &connects
}

// declare runs fn on a channel of its own.
func declare(t *testing.T, url string, fn func(ch *amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, fn(ch))
}

func TestPublisherBlamesOneThing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InvalidMessagesArePermanentAndNeverSent", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		pub, connects := countingPublisher(t, outboxrabbitmq.Config{URL: url})

		bad := func(f func(m *outbox.Message)) outbox.Message {
			m := message(top.Exchange)
			f(&m)
			return m
		}
		batch := []outbox.Message{
			message(top.Exchange),
			bad(func(m *outbox.Message) { m.Exchange = strings.Repeat("x", 256) }),
			bad(func(m *outbox.Message) { m.RoutingKey = strings.Repeat("x", 256) }),
			bad(func(m *outbox.Message) { m.Type = strings.Repeat("x", 256) }),
			bad(func(m *outbox.Message) { m.Headers = map[string]string{strings.Repeat("x", 256): "v"} }),
			bad(func(m *outbox.Message) {
				m.Headers = map[string]string{outbox.HeaderCorrelationID: strings.Repeat("x", 256)}
			}),
			bad(func(m *outbox.Message) { m.Headers = map[string]string{"CC": "q"} }),
			bad(func(m *outbox.Message) { m.Headers = map[string]string{"big": strings.Repeat("x", 200_000)} }),
			bad(func(m *outbox.Message) { m.Payload = nil }),
			bad(func(m *outbox.Message) { m.AggregateID = "" }),
			message(top.Exchange),
		}
		errs := pub.Publish(ctx, batch)
		require.NoError(t, errs[0])
		require.NoError(t, errs[len(errs)-1])
		for i, err := range errs[1 : len(errs)-1] {
			require.True(t, outbox.IsPermanent(err), "message %d: %v", i+1, err)
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		}
		require.Equal(t, 2, queueDepth(t, url, top.Queue), "no invalid message was sent")

		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		require.Equal(t, int32(1), connects.Load(), "an invalid message costs no reconnect")
	})

	t.Run("ABodyOverMaxMessageBytesIsNeverSent", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		pub, _ := countingPublisher(t, outboxrabbitmq.Config{URL: url, MaxMessageBytes: 1024})
		big := message(top.Exchange)
		big.Payload = json.RawMessage(`"` + strings.Repeat("x", 1023) + `"`)
		errs := pub.Publish(ctx, []outbox.Message{big, message(top.Exchange)})
		require.True(t, outbox.IsPermanent(errs[0]))
		require.ErrorIs(t, errs[0], outbox.ErrTooLarge)
		require.NoError(t, errs[1])
		require.Equal(t, 1, queueDepth(t, url, top.Queue))
	})

	t.Run("ChannelClosedOverAnUnnamedMessageChargesOnlyIt", func(t *testing.T) {
		// RabbitMQ closes the channel with 404 for a message to an exchange that does not
		// exist, and names the exchange, not the message. Another exchange's name appears in
		// the reason too: "no exchange 'X' in vhost '/'" contains 'X' in vhost '/', the
		// quoted name of the second exchange. Only the guilty message may be charged.
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		missing := top.Exchange + ".missing"
		lookalike := missing + "' in vhost '/"
		declare(t, url, func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare(lookalike, "topic", false, false, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind(top.Queue, "#", lookalike, false, nil)
		})
		testinfra.DeleteExchangeAtCleanup(t, url, lookalike)
		pub, connects := countingPublisher(t, outboxrabbitmq.Config{URL: url})

		var batch []outbox.Message
		for i := range 20 {
			ex := top.Exchange
			if i%2 == 1 {
				ex = lookalike
			}
			batch = append(batch, message(ex))
		}
		batch[7] = message(missing)
		errs := pub.Publish(ctx, batch)
		for i, err := range errs {
			if i == 7 {
				require.ErrorContains(t, err, "404")
				require.False(t, outbox.IsPermanent(err), "a missing exchange may be declared later")
				require.NotErrorIs(t, err, outbox.ErrNotSent)
				require.NotErrorIs(t, err, outbox.ErrUnavailable)
				continue
			}
			require.NoError(t, err, "message %d is not to blame", i)
		}
		// The messages before the guilty one may have reached the queue without their
		// confirms (the channel closed first): those are published again, at least once.
		depth := queueDepth(t, url, top.Queue)
		require.GreaterOrEqual(t, depth, 19)
		require.LessOrEqual(t, depth, 19+7)
		require.Equal(t, int32(1), connects.Load(), "a channel error costs no reconnect")

		// The publisher goes on with a fresh channel on the same connection.
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		require.Equal(t, int32(1), connects.Load())
	})

	t.Run("SeveralRefusedMessagesInOneBatch", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		pub, connects := countingPublisher(t, outboxrabbitmq.Config{URL: url})
		batch := make([]outbox.Message, 30)
		guilty := map[int]bool{3: true, 4: true, 17: true, 29: true}
		for i := range batch {
			batch[i] = message(top.Exchange)
			if guilty[i] {
				batch[i] = message(fmt.Sprintf("%s.missing-%d", top.Exchange, i))
			}
		}
		for i, err := range pub.Publish(ctx, batch) {
			if guilty[i] {
				require.ErrorContains(t, err, "404", "message %d", i)
				continue
			}
			require.NoError(t, err, "message %d", i)
		}
		require.GreaterOrEqual(t, queueDepth(t, url, top.Queue), 30-len(guilty))
		require.Equal(t, int32(1), connects.Load())
	})

	t.Run("NackIsRefusedNotTheMessagesFault", func(t *testing.T) {
		// A full queue with overflow reject-publish nacks: the consumers are down, the
		// message is fine.
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		full := testinfra.UniqueName(t, "full")
		declare(t, url, func(ch *amqp.Channel) error {
			if _, err := ch.QueueDeclare(full, false, true, false, false, amqp.Table{"x-max-length": 1, "x-overflow": "reject-publish"}); err != nil {
				return err
			}
			return ch.QueueBind(full, "#", top.Exchange, false, nil)
		})
		// Auto-delete needs a consumer to have come and gone; this queue never has one.
		t.Cleanup(func() {
			declare(t, url, func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(full, false, false, false)
				return err
			})
		})
		pub, _ := countingPublisher(t, outboxrabbitmq.Config{URL: url})
		errs := pub.Publish(ctx, []outbox.Message{message(top.Exchange), message(top.Exchange), message(top.Exchange)})
		require.NoError(t, errs[0])
		for _, err := range errs[1:] {
			require.ErrorIs(t, err, outbox.ErrRefused)
			require.ErrorIs(t, err, outboxrabbitmq.ErrNacked)
			require.False(t, outbox.IsPermanent(err))
		}
	})
}

func TestPublisherDeadlines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxied := func(t *testing.T) (*testinfra.Proxy, string, testinfra.Topology) {
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		u := must(amqp.ParseURI(url))
		proxy := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", u.Host, u.Port))
		return proxy, proxy.RewriteURL(t, url), top
	}

	t.Run("BrokerThatStopsReadingIsUnavailableWithinTheDeadline", func(t *testing.T) {
		// amqp091-go writes to the socket with no deadline: against a broker that reads
		// nothing, a batch larger than the socket buffers would block for ever.
		t.Parallel()
		proxy, url, top := proxied(t)
		pub, _ := countingPublisher(t, outboxrabbitmq.Config{URL: url})
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])

		proxy.Freeze()
		batch := make([]outbox.Message, 32)
		for i := range batch {
			batch[i] = message(top.Exchange)
			batch[i].Payload = json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)
		}
		const timeout = time.Second
		short, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		start := time.Now()
		errs := pub.Publish(short, batch)
		took := time.Since(start)
		require.Less(t, took, timeout+time.Second, "Publish returns within the deadline")
		for i, err := range errs {
			require.ErrorIs(t, err, outbox.ErrUnavailable, "message %d", i)
		}
		t.Logf("a frozen broker: Publish returned after %s", took)

		// What the socket buffers held reaches the broker once it reads again: reported
		// unavailable, those messages are published again later (at least once).
		proxy.Resume()
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0], "a fresh connection afterwards")
	})

	t.Run("HungHandshakeIsUnavailableWithinTheDeadline", func(t *testing.T) {
		t.Parallel()
		proxy, url, top := proxied(t)
		pub, _ := countingPublisher(t, outboxrabbitmq.Config{URL: url, DialTimeout: time.Minute})
		proxy.Stall()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := pub.Publish(short, []outbox.Message{message(top.Exchange)})[0]
		require.Less(t, time.Since(start), 300*time.Millisecond+time.Second)
		require.ErrorIs(t, err, outbox.ErrUnavailable)
		proxy.Resume()
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
	})

	t.Run("WaitingForAnotherCallerIsNotSentNotAnOutage", func(t *testing.T) {
		// Two relays share one publisher. The first holds it, waiting for confirms of a
		// hung broker; the second's deadline passes before its turn: nothing of its batch
		// is sent, and that is no outage.
		t.Parallel()
		proxy, url, top := proxied(t)
		pub, _ := countingPublisher(t, outboxrabbitmq.Config{URL: url})
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])

		proxy.Stall()
		first := make(chan []error, 1)
		holding := make(chan struct{})
		go func() {
			long, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			close(holding)
			first <- pub.Publish(long, []outbox.Message{message(top.Exchange), message(top.Exchange)})
		}()
		<-holding
		// Let the first caller take the publisher: its batch reaches the broker, whose
		// confirms the proxy holds back.
		testinfra.Eventually(t, 5*time.Second, func() bool {
			return queueDepth(t, testinfra.AMQPURL(t), top.Queue) == 3
		}, "the first batch reached the broker")

		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		errs := pub.Publish(short, []outbox.Message{message(top.Exchange), message(top.Exchange)})
		require.Less(t, time.Since(start), 200*time.Millisecond+time.Second)
		for _, err := range errs {
			require.ErrorIs(t, err, outbox.ErrNotSent)
			require.NotErrorIs(t, err, outbox.ErrUnavailable)
		}
		for _, err := range <-first {
			require.ErrorIs(t, err, outbox.ErrUnavailable, "the first caller did see a hung broker")
		}
		proxy.Resume()
		require.Equal(t, 3, queueDepth(t, testinfra.AMQPURL(t), top.Queue), "the second batch was never sent")
	})
}

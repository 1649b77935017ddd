package inboxrabbitmq_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestConsumer(t *testing.T) {
	t.Parallel()

	t.Run("ProcessesEachMessageOnceAndAcks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		stop := b.run(t, b.config(recordEffect))

		const n = 20
		for i := range n {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == n
		}, "not all %d messages were processed", n)
		stop()

		for i := range n {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
		}
		messages, _ := b.queueState(t, b.top.Queue)
		require.Zero(t, messages, "messages left in the queue: not acknowledged")
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates)

		// Every per-message log line names the message, its type and the consumer.
		logged := b.logs.find("message processed")
		require.Len(t, logged, n)
		for _, r := range logged {
			require.Equal(t, "orders-projection", r.attrs["consumer"])
			require.Equal(t, "order.placed", r.attrs["message_type"])
			require.True(t, strings.HasPrefix(r.attrs["message_id"].(string), "order-"))
		}
	})

	t.Run("SameMessageIDTwiceIsAppliedOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.config(recordEffect))

		b.publish(t, jsonMessage("order-1"))
		b.publish(t, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed == 1 && duplicates == 1
		}, "expected one processed message and one duplicate")
		require.Equal(t, 1, b.effects(t, "order-1"))
		require.Len(t, b.logs.find("duplicate message skipped"), 1)
	})

	t.Run("TransientErrorSucceedsOnThirdTry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var (
			mu   sync.Mutex
			seen []inboxrabbitmq.Delivery
		)
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			mu.Lock()
			seen = append(seen, d)
			mu.Unlock()
			if err := recordEffect(ctx, tx, d); err != nil {
				return err
			}
			if d.DeliveryCount < 3 {
				return errTransient // rolls the effect back
			}
			return nil
		})
		cfg.MaxDeliveries = 5
		stop := b.run(t, cfg)

		b.publish(t, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1
		}, "the message was not processed")
		stop()

		require.Equal(t, 1, b.effects(t, "order-1"))
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, seen, 3)
		for i, d := range seen {
			require.Equal(t, i+1, d.DeliveryCount)
			require.Equal(t, "order-1", d.ID)
			// Retry copies travel through the default exchange, but the handler sees the
			// original route.
			require.Equal(t, b.top.Exchange, d.Exchange)
			require.Equal(t, routingKey, d.RoutingKey)
			require.JSONEq(t, `{"order_id":"order-1"}`, string(d.Body))
		}
		require.Equal(t, []int{1, 2}, b.events.retried)
		require.Empty(t, b.events.deadReasons())
		messages, _ := b.queueState(t, b.top.Queue)
		require.Zero(t, messages, "the original or a retry copy was left in the queue")
		deadMessages, _ := b.queueState(t, b.dead.Queue)
		require.Zero(t, deadMessages)
	})

	t.Run("AlwaysFailingEndsInDeadLetterQueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var (
			mu     sync.Mutex
			counts []int
		)
		b.run(t, b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			mu.Lock()
			counts = append(counts, d.DeliveryCount)
			mu.Unlock()
			if err := recordEffect(ctx, tx, d); err != nil {
				return err
			}
			return errors.New("warehouse says no")
		}))

		msg := jsonMessage("order-1")
		msg.CorrelationId = "corr-1"
		msg.Headers = amqp.Table{"tenant": "acme"}
		b.publish(t, msg)
		dead := b.getOne(t, b.dead.Queue)

		require.Equal(t, "order-1", dead.MessageId)
		require.Equal(t, "order.placed", dead.Type)
		require.Equal(t, "corr-1", dead.CorrelationId)
		require.Equal(t, "application/json", dead.ContentType)
		require.Equal(t, msg.Body, dead.Body)
		require.Equal(t, "acme", dead.Headers["tenant"])
		reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.True(t, strings.HasPrefix(reason, inboxrabbitmq.ReasonMaxDeliveries+": "), reason)
		require.Contains(t, reason, "warehouse says no")
		require.Equal(t, b.top.Queue, dead.Headers[inboxrabbitmq.HeaderOriginalQueue])
		require.Equal(t, routingKey, dead.Headers[inboxrabbitmq.HeaderOriginalRoutingKey])
		require.Equal(t, b.top.Exchange, dead.Headers[inboxrabbitmq.HeaderOriginalExchange])

		testinfra.Eventually(t, 10*time.Second, func() bool {
			return len(b.events.deadReasons()) == 1
		}, "the DeadLettered hook was not called")
		require.Equal(t, []string{inboxrabbitmq.ReasonMaxDeliveries}, b.events.deadReasons())
		mu.Lock()
		require.Equal(t, []int{1, 2, 3}, counts, "MaxDeliveries is 3")
		mu.Unlock()
		require.Zero(t, b.effects(t, "order-1"))
		var inboxRows int
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM inbox_messages`).Scan(&inboxRows))
		require.Zero(t, inboxRows)
	})

	// Required: malformed input is dead-lettered at once, with the reason, never retried
	// and never dropped.
	t.Run("MalformedInputIsDeadLetteredAtOnce", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name   string
			msg    amqp.Publishing
			reason string
		}{
			{
				name:   "MalformedJSON",
				msg:    amqp.Publishing{MessageId: "order-1", ContentType: "application/json", Body: []byte(`{"order_id":`)},
				reason: inboxrabbitmq.ReasonMalformedJSON + ": body is not valid JSON: unexpected end of JSON input",
			},
			{
				name:   "MalformedJSONWithoutContentType",
				msg:    amqp.Publishing{MessageId: "order-1", Body: []byte(`order 1`)},
				reason: inboxrabbitmq.ReasonMalformedJSON + ": body is not valid JSON: ",
			},
			{
				name:   "MissingMessageID",
				msg:    amqp.Publishing{ContentType: "application/json", Body: []byte(`{"order_id":"1"}`)},
				reason: inboxrabbitmq.ReasonMissingMessageID + ": ",
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.run(t, b.config(func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error {
					t.Error("the handler was called for malformed input")
					return nil
				}))

				b.publish(t, tc.msg)
				dead := b.getOne(t, b.dead.Queue)
				reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
				require.True(t, strings.HasPrefix(reason, tc.reason), "reason %q, want prefix %q", reason, tc.reason)
				require.Equal(t, tc.msg.Body, dead.Body)
				require.Equal(t, tc.msg.MessageId, dead.MessageId)
				require.Equal(t, b.top.Queue, dead.Headers[inboxrabbitmq.HeaderOriginalQueue])
				require.Equal(t, routingKey, dead.Headers[inboxrabbitmq.HeaderOriginalRoutingKey])
				require.Nil(t, dead.Headers[inboxrabbitmq.HeaderRetries], "dead-lettered at once, not after retries")
				testinfra.Eventually(t, 10*time.Second, func() bool {
					return len(b.events.deadReasons()) == 1
				}, "the DeadLettered hook was not called")
				require.Empty(t, b.events.retried)
			})
		}
	})

	t.Run("NonJSONContentTypeIsNotValidated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.config(recordEffect))

		b.publish(t, amqp.Publishing{MessageId: "order-1", ContentType: "text/plain", Body: []byte("not json")})
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1
		}, "the message was not processed")
		require.Equal(t, 1, b.effects(t, "order-1"))
	})

	t.Run("PermanentErrorIsDeadLetteredAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var (
			mu    sync.Mutex
			calls int
		)
		b.run(t, b.config(func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error {
			mu.Lock()
			calls++
			mu.Unlock()
			return fmt.Errorf("reserve stock: %w", inbox.Permanent(errors.New("unknown sku")))
		}))

		b.publish(t, jsonMessage("order-1"))
		dead := b.getOne(t, b.dead.Queue)
		reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.Equal(t, inboxrabbitmq.ReasonPermanent+": reserve stock: unknown sku", reason)
		testinfra.Eventually(t, 10*time.Second, func() bool {
			return len(b.events.deadReasons()) == 1
		}, "the DeadLettered hook was not called")
		require.Equal(t, []string{inboxrabbitmq.ReasonPermanent}, b.events.deadReasons())
		mu.Lock()
		require.Equal(t, 1, calls)
		mu.Unlock()
	})

	t.Run("PanickingHandlerIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if d.DeliveryCount == 1 {
				panic("nil map somewhere")
			}
			return recordEffect(ctx, tx, d)
		}))

		b.publish(t, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1
		}, "the message was not processed after the panic")
		require.Equal(t, 1, b.effects(t, "order-1"))
		require.Len(t, b.logs.find("handler panicked"), 1)
	})

	t.Run("UnroutableDeadLetterStaysInQueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The dead-letter exchange exists, but no queue is bound to it yet.
		cfg := b.config(recordEffect)
		cfg.DeadLetterExchange = testinfra.UniqueName(t, "dlx")
		require.NoError(t, b.ch.ExchangeDeclare(cfg.DeadLetterExchange, "direct", false, false, false, false, nil))
		t.Cleanup(func() { _ = b.ch.ExchangeDelete(cfg.DeadLetterExchange, false, false) })
		b.run(t, cfg)

		b.publish(t, amqp.Publishing{MessageId: "order-1", ContentType: "application/json", Body: []byte(`{`)})
		// The message is held, not requeued: a reject would count a delivery on a quorum
		// queue.
		b.waitHeldRetries(t, "dead-lettering failed (malformed-json: body is not valid JSON: unexpected end of JSON input)", 2)
		require.Empty(t, b.events.deadReasons())
		require.Empty(t, b.events.handedBack())

		require.NoError(t, b.ch.QueueBind(b.dead.Queue, "dead", cfg.DeadLetterExchange, false, nil))
		dead := b.getOne(t, b.dead.Queue)
		require.Equal(t, "order-1", dead.MessageId)
		testinfra.Eventually(t, 10*time.Second, func() bool {
			return len(b.events.deadReasons()) == 1
		}, "the DeadLettered hook was not called")
	})

	t.Run("MissingDeadLetterExchangeKeepsMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(recordEffect)
		cfg.DeadLetterExchange = testinfra.UniqueName(t, "dlx")
		b.run(t, cfg)

		b.publish(t, amqp.Publishing{MessageId: "order-1", Body: []byte(`not json`)})
		b.waitHeldRetries(t, "dead-lettering failed (malformed-json: body is not valid JSON: invalid character 'o' in literal null (expecting 'u'))", 2)

		// Once the exchange exists, the (reopened) publish channel gets it there.
		require.NoError(t, b.ch.ExchangeDeclare(cfg.DeadLetterExchange, "direct", false, false, false, false, nil))
		t.Cleanup(func() { _ = b.ch.ExchangeDelete(cfg.DeadLetterExchange, false, false) })
		require.NoError(t, b.ch.QueueBind(b.dead.Queue, "dead", cfg.DeadLetterExchange, false, nil))
		dead := b.getOne(t, b.dead.Queue)
		require.Equal(t, "order-1", dead.MessageId)
	})

	t.Run("GracefulStopFinishesInFlightAndHandsBackTheRest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var (
			entered = make(chan string, 10)
			release = make(chan struct{})
			runDone = make(chan struct{})
		)
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			entered <- d.ID
			<-release
			select {
			case <-runDone:
				t.Error("Run returned while a handler was still running")
			default:
			}
			return recordEffect(ctx, tx, d)
		})
		cfg.Concurrency = 1
		c, err := inboxrabbitmq.NewConsumer(b.pool, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- c.Run(ctx)
			close(runDone)
		}()

		for i := range 3 {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		<-entered
		cancel()
		// The consumer stops consuming while its handler is still busy.
		testinfra.Eventually(t, 10*time.Second, func() bool {
			_, consumers := b.queueState(t, b.top.Queue)
			return consumers == 0
		}, "the consumer did not cancel its subscription")
		close(release)
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return")
		}

		// In a batch, the message in flight may run a second time, to its end, when the
		// batch runs again with a savepoint per message (its next message, handed back,
		// ended the first attempt); no other message starts.
		close(entered)
		for id := range entered {
			require.True(t, cfg.BatchSize > 1 && id == "order-0", "a handler started after the stop, for %s", id)
		}
		require.Equal(t, 1, b.effects(t, "order-0"), "the in-flight message was not committed")
		// The in-flight message was acknowledged; the two prefetched ones went back.
		testinfra.Eventually(t, 10*time.Second, func() bool {
			messages, _ := b.queueState(t, b.top.Queue)
			return messages == 2
		}, "the queue does not hold exactly the two prefetched messages")
	})

	t.Run("ShutdownTimeoutCancelsHandlers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		entered := make(chan struct{}, 1)
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if err := recordEffect(ctx, tx, d); err != nil {
				return err
			}
			entered <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		})
		cfg.ShutdownTimeout = 100 * time.Millisecond
		stop := b.run(t, cfg)

		b.publish(t, jsonMessage("order-1"))
		<-entered
		stop()

		require.Zero(t, b.effects(t, "order-1"), "the cancelled handler's change was committed")
		testinfra.Eventually(t, 10*time.Second, func() bool {
			messages, _ := b.queueState(t, b.top.Queue)
			return messages == 1
		}, "the cancelled message did not go back to the queue")
		require.Empty(t, b.events.retried, "a shutdown is not the message's failure")
	})

	t.Run("ReconnectsAfterBrokerOutage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		cfg := b.config(recordEffect)
		cfg.URL = proxy.RewriteURL(t, b.amqpURL)
		b.run(t, cfg)
		b.events.waitConnected(t, true)

		b.publish(t, jsonMessage("before"))
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "before") == 1 }, "not processed before the outage")

		proxy.Cut()
		b.events.waitConnected(t, false)
		b.publish(t, jsonMessage("during")) // the test's own connection does not go through the proxy
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return len(b.logs.find("connection attempt failed")) >= 2
		}, "the consumer did not keep trying to reconnect")

		proxy.Heal()
		b.events.waitConnected(t, true)
		b.publish(t, jsonMessage("after"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return b.effects(t, "during") == 1 && b.effects(t, "after") == 1
		}, "messages published during and after the outage were not processed")
		require.Equal(t, 1, b.effects(t, "before"))

		// One line per state change, not one per failed attempt.
		lost := b.logs.find("rabbitmq consumer: broker connection: failing; retrying with backoff")
		require.Len(t, lost, 1)
		require.ErrorContains(t, lost[0].attrs["error"].(error), "lost the connection to "+proxy.Addr())
		require.Len(t, b.logs.find("rabbitmq consumer: broker connection: recovered"), 1)
		require.Len(t, b.logs.find("consuming"), 2)
	})

	t.Run("WaitsForTheBrokerAtStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		proxy.Cut()
		cfg := b.config(recordEffect)
		cfg.URL = proxy.RewriteURL(t, b.amqpURL)
		b.run(t, cfg)
		b.publish(t, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return len(b.logs.find("connection attempt failed")) >= 2
		}, "the consumer did not keep trying to connect")

		proxy.Heal()
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "order-1") == 1 }, "not processed after the broker came")
		require.Len(t, b.logs.find("rabbitmq consumer: broker connection: failing; retrying with backoff"), 1)
	})

	t.Run("SetupDeclaresTopologyOnEveryConnect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		queue := testinfra.UniqueName(t, "q")
		t.Cleanup(func() { _, _ = b.ch.QueueDelete(queue, false, false, false) })
		var (
			mu     sync.Mutex
			setups int
		)
		proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		cfg := b.config(recordEffect)
		cfg.URL = proxy.RewriteURL(t, b.amqpURL)
		cfg.Queue = queue
		cfg.Setup = func(ch *amqp.Channel) error {
			mu.Lock()
			setups++
			mu.Unlock()
			if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind(queue, "orders.#", b.top.Exchange, false, nil)
		}
		b.run(t, cfg)
		b.events.waitConnected(t, true)
		proxy.Cut()
		b.events.waitConnected(t, false)
		proxy.Heal()
		b.events.waitConnected(t, true)

		b.publish(t, jsonMessage("order-1"))
		testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "order-1") == 1 }, "not processed from the queue Setup declared")
		mu.Lock()
		require.Equal(t, 2, setups)
		mu.Unlock()
	})

	t.Run("RunTwiceAtOnceIsAnError", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, err := inboxrabbitmq.NewConsumer(b.pool, b.config(recordEffect))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		b.events.waitConnected(t, true)

		require.Error(t, c.Run(ctx))
		cancel()
		require.NoError(t, <-done)
	})
}

func TestNewConsumer(t *testing.T) {
	t.Parallel()
	valid := inboxrabbitmq.Config{
		URL:                "amqp://guest:guest@127.0.0.1:5672/",
		Queue:              "orders",
		Name:               "orders-projection",
		Handler:            recordEffect,
		DeadLetterExchange: "dead",
	}
	var pool *pgxpool.Pool // never used: NewConsumer does not connect

	t.Run("ValidConfig", func(t *testing.T) {
		t.Parallel()
		for name, cfg := range map[string]inboxrabbitmq.Config{
			"Minimal":                     valid,
			"DefaultExchangeDeadLetters":  with(valid, func(c *inboxrabbitmq.Config) { c.DeadLetterExchange, c.DeadLetterRoutingKey = "", "orders.dead" }),
			"ConcurrencyEqualsPrefetch":   with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.Concurrency = 4, 4 }),
			"DefaultPrefetchConcurrency8": with(valid, func(c *inboxrabbitmq.Config) { c.Concurrency = 8 }),
			"LongRetryDelay":              with(valid, func(c *inboxrabbitmq.Config) { c.RetryBaseDelay = time.Minute }),
			"URLs": with(valid, func(c *inboxrabbitmq.Config) {
				c.URL, c.URLs = "", []string{"amqp://guest:guest@node-a:5672/", "amqps://node-b/shop"}
			}),
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c, err := inboxrabbitmq.NewConsumer(pool, cfg)
				require.NoError(t, err)
				require.NotNil(t, c)
			})
		}
	})

	t.Run("InvalidConfig", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			cfg  inboxrabbitmq.Config
			want string
		}{
			"NoURL":       {with(valid, func(c *inboxrabbitmq.Config) { c.URL = "" }), "URL or URLs is required"},
			"BadURL":      {with(valid, func(c *inboxrabbitmq.Config) { c.URL = "http://x" }), "URL:"},
			"URLAndURLs":  {with(valid, func(c *inboxrabbitmq.Config) { c.URLs = []string{c.URL} }), "set URL or URLs, not both"},
			"EmptyInURLs": {with(valid, func(c *inboxrabbitmq.Config) { c.URL, c.URLs = "", []string{"amqp://a/", ""} }), "URLs[1] is empty"},
			"BadInURLs":   {with(valid, func(c *inboxrabbitmq.Config) { c.URL, c.URLs = "", []string{"amqp://a/", "http://b"} }), "URLs[1]:"},
			"TLSConfigWithPlainURL": {with(valid, func(c *inboxrabbitmq.Config) { c.URL, c.TLSClientConfig = "amqp://a/", &tls.Config{} }),
				"URL is amqp://, which TLSClientConfig does not apply to: use amqps://"},
			"TLSConfigAndURLFiles": {with(valid, func(c *inboxrabbitmq.Config) {
				c.URL, c.URLs, c.TLSClientConfig = "", []string{"amqps://a/", "amqps://b/?certfile=/c.pem&keyfile=/k.pem"}, &tls.Config{}
			}), "URLs[1] has TLS parameters"},
			"NoQueue":             {with(valid, func(c *inboxrabbitmq.Config) { c.Queue = "" }), "queue is required"},
			"NoName":              {with(valid, func(c *inboxrabbitmq.Config) { c.Name = "" }), "name"},
			"NoHandler":           {with(valid, func(c *inboxrabbitmq.Config) { c.Handler = nil }), "handler is required"},
			"NoDeadLetter":        {with(valid, func(c *inboxrabbitmq.Config) { c.DeadLetterExchange = "" }), "dead-letter destination is required"},
			"NegativePrefetch":    {with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch = -1 }), "prefetch"},
			"HugePrefetch":        {with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch = 70000 }), "prefetch"},
			"ConcurrencyAbove":    {with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.Concurrency = 2, 3 }), "concurrency"},
			"NegativeBatch":       {with(valid, func(c *inboxrabbitmq.Config) { c.BatchSize = -1 }), "batch size"},
			"BatchAboveMax":       {with(valid, func(c *inboxrabbitmq.Config) { c.BatchSize = inbox.MaxBatch + 1 }), "batch size must be between 0 (default 1) and 64"},
			"BatchAbovePrefetch":  {with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.BatchSize = 4, 8 }), "batch size (8) must not exceed prefetch (4)"},
			"NegativeBatchWait":   {with(valid, func(c *inboxrabbitmq.Config) { c.BatchWait = -1 }), "batch wait"},
			"NegativeAckEvery":    {with(valid, func(c *inboxrabbitmq.Config) { c.AckEvery = -1 }), "ack every"},
			"AckEveryAbove":       {with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.AckEvery = 4, 5 }), "ack every must be between 0 (default 8) and prefetch (4)"},
			"NegativeDeliveries":  {with(valid, func(c *inboxrabbitmq.Config) { c.MaxDeliveries = -1 }), "max deliveries"},
			"NegativeRetryDelay":  {with(valid, func(c *inboxrabbitmq.Config) { c.RetryBaseDelay = -time.Second }), "retry base delay"},
			"MaxBelowRetryDelay":  {with(valid, func(c *inboxrabbitmq.Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Second, time.Millisecond }), "retry max delay"},
			"NegativeShutdown":    {with(valid, func(c *inboxrabbitmq.Config) { c.ShutdownTimeout = -1 }), "shutdown timeout"},
			"MaxBelowReconnect":   {with(valid, func(c *inboxrabbitmq.Config) { c.OutageBaseDelay, c.OutageMaxDelay = time.Second, time.Millisecond }), "outage max delay"},
			"NegativePublishWait": {with(valid, func(c *inboxrabbitmq.Config) { c.PublishTimeout = -1 }), "publish timeout"},
			"NegativeMaxHold":     {with(valid, func(c *inboxrabbitmq.Config) { c.MaxHold = -1 }), "max hold"},
			"NegativeMaxBody":     {with(valid, func(c *inboxrabbitmq.Config) { c.MaxMessageBytes = -1 }), "max message bytes"},
			"NULInName":           {with(valid, func(c *inboxrabbitmq.Config) { c.Name = "orders\x00" }), "inbox: invalid consumer config: name: invalid consumer name"},
			"NameTooLong":         {with(valid, func(c *inboxrabbitmq.Config) { c.Name = strings.Repeat("n", 256) }), "inbox: invalid consumer config: name: invalid consumer name"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				_, err := inboxrabbitmq.NewConsumer(pool, tc.cfg)
				require.ErrorContains(t, err, tc.want)
				require.True(t, strings.HasPrefix(err.Error(), "inbox: "), err.Error())
				require.Equal(t, 1, strings.Count(err.Error(), "inbox: "), "the library's name twice: %v", err)
			})
		}
	})

	t.Run("BadURLHidesPassword", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []inboxrabbitmq.Config{
			with(valid, func(c *inboxrabbitmq.Config) { c.URL = "amqp://user:s3cret@host:port/" }),
			with(valid, func(c *inboxrabbitmq.Config) {
				c.URL, c.URLs = "", []string{"amqp://a/", "amqp://user:s3cret@host:port/"}
			}),
			// A password with a / not percent-encoded: the parser quotes it as the port.
			with(valid, func(c *inboxrabbitmq.Config) { c.URL = "amqp://user:s3cret/x@host:5672/" }),
		} {
			_, err := inboxrabbitmq.NewConsumer(pool, cfg)
			require.ErrorContains(t, err, "invalid port")
			require.NotContains(t, err.Error(), "s3cret")
		}
	})

	t.Run("NilPool", func(t *testing.T) {
		t.Parallel()
		_, err := inboxrabbitmq.NewConsumer(nil, valid)
		require.ErrorContains(t, err, "pool is nil")
	})

	t.Run("WithDefaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := valid.WithDefaults()
		require.NoError(t, err)
		require.Equal(t, inboxrabbitmq.DefaultPrefetch, cfg.Prefetch)
		require.Equal(t, inboxrabbitmq.DefaultPrefetch, cfg.Concurrency)
		require.Equal(t, 1, cfg.BatchSize)
		require.Zero(t, cfg.BatchWait)
		require.Equal(t, inboxrabbitmq.DefaultAckEvery, cfg.AckEvery)
		require.Equal(t, inboxrabbitmq.DefaultMaxDeliveries, cfg.MaxDeliveries)
		require.Equal(t, inboxrabbitmq.DefaultRetryBaseDelay, cfg.RetryBaseDelay)
		require.Equal(t, inboxrabbitmq.DefaultRetryMaxDelay, cfg.RetryMaxDelay)
		require.Equal(t, inboxrabbitmq.DefaultMaxHold, cfg.MaxHold)
		require.Equal(t, inboxrabbitmq.DefaultMaxMessageBytes, cfg.MaxMessageBytes)
		require.Equal(t, inboxrabbitmq.DefaultOutageBaseDelay, cfg.OutageBaseDelay)
		require.Equal(t, inboxrabbitmq.DefaultOutageMaxDelay, cfg.OutageMaxDelay)
		require.Equal(t, inboxrabbitmq.DefaultPublishTimeout, cfg.PublishTimeout)
		require.Equal(t, inboxrabbitmq.DefaultShutdownTimeout, cfg.ShutdownTimeout)
		require.NotNil(t, cfg.Logger)
		require.NotNil(t, cfg.TracerProvider)
		require.NotNil(t, cfg.Propagator)

		// Batches: Concurrency follows Prefetch per batch; AckEvery is at most Prefetch.
		cfg, err = with(valid, func(c *inboxrabbitmq.Config) { c.BatchSize = 8 }).WithDefaults()
		require.NoError(t, err)
		require.Equal(t, inboxrabbitmq.DefaultPrefetch/8, cfg.Concurrency)
		cfg, err = with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.BatchSize = 4, 4 }).WithDefaults()
		require.NoError(t, err)
		require.Equal(t, 1, cfg.Concurrency)
		require.Equal(t, 1, cfg.AckEvery, "a quarter of Prefetch")
		cfg, err = with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch = 16 }).WithDefaults()
		require.NoError(t, err)
		require.Equal(t, 4, cfg.AckEvery, "a quarter of Prefetch")
		cfg, err = with(valid, func(c *inboxrabbitmq.Config) { c.Prefetch, c.AckEvery = 16, 16 }).WithDefaults()
		require.NoError(t, err)
		require.Equal(t, 16, cfg.AckEvery, "set: up to Prefetch")

		// A max delay left zero is at least its base delay.
		cfg, err = with(valid, func(c *inboxrabbitmq.Config) { c.RetryBaseDelay, c.OutageBaseDelay = time.Hour, time.Hour }).WithDefaults()
		require.NoError(t, err)
		require.Equal(t, time.Hour, cfg.RetryMaxDelay)
		require.Equal(t, time.Hour, cfg.OutageMaxDelay)

		// The errors of package inbox's validations are wrapped.
		_, err = with(valid, func(c *inboxrabbitmq.Config) { c.Name = "\xff" }).WithDefaults()
		require.ErrorIs(t, err, inbox.ErrInvalidConsumer)
		_, err = with(valid, func(c *inboxrabbitmq.Config) { c.Tables.Messages = strings.Repeat("t", 64) }).WithDefaults()
		require.ErrorIs(t, err, inbox.ErrInvalidTables)
		require.ErrorContains(t, err, "inbox: invalid consumer config: tables: invalid table names: Messages is 64 bytes long")
	})
}

func with(cfg inboxrabbitmq.Config, change func(*inboxrabbitmq.Config)) inboxrabbitmq.Config {
	change(&cfg)
	return cfg
}

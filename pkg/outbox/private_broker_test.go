package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// A private broker of its own configuration, for what the shared one must not be put
// through: a small max_message_size and frame_max, and a memory alarm. One node serves every
// subtest (it takes seconds to start); they run one after the other.
const (
	privateMaxMessageSize = 256 << 10
	privateFrameMax       = 16384
)

func TestPrivateBroker(t *testing.T) {
	t.Parallel()
	node := testinfra.StartRabbitNode(t,
		fmt.Sprintf("max_message_size = %d", privateMaxMessageSize),
		fmt.Sprintf("frame_max = %d", privateFrameMax))
	private := func(t *testing.T) *poisonBundle {
		b := &bundle{pool: testinfra.NewPool(t), amqpURL: node.URL}
		require.NoError(t, outbox.Migrate(context.Background(), b.pool))
		b.top = testinfra.DeclareTopology(t, node.URL)
		return &poisonBundle{bundle: b, t: t}
	}

	// The relay publishes the corpus's payloads in the form jsonb prints them; a row's content
	// header frame, as the publisher writes it, is then 95 bytes plus the encoded headers
	// (frame overhead and fixed fields 22, content type 17, delivery mode 1, message id 37,
	// timestamp 8, type "TestEvent" 10).
	const frameOverhead = 95
	withFrame := func(size int) func(b *poisonBundle) outbox.Message {
		return func(b *poisonBundle) outbox.Message {
			m := b.msg("poison", 1)
			m.Headers = headersOf(m, size-frameOverhead)
			return m
		}
	}
	for _, c := range []poisonCase{
		// RabbitMQ refuses the body by closing the channel (406, naming no message): the
		// publisher finds the message and charges it; permanent, as no retry can help.
		{name: "BodyOverMaxMessageSize", want: dead, cause: "message size 262145 is larger than configured max size 262144",
			maxMessageBytes: 1 << 20, msg: func(b *poisonBundle) outbox.Message {
				m := b.msg("poison", 1)
				m.Payload = sized(privateMaxMessageSize + 1)
				return m
			}},
		{name: "BodyAtMaxMessageSize", want: published, maxMessageBytes: 1 << 20, msg: func(b *poisonBundle) outbox.Message {
			m := b.msg("poison", 1)
			m.Payload = sized(privateMaxMessageSize)
			return m
		}},
		// Headers within MaxHeaderBytes but over this broker's frame_max: the publisher
		// checks the content header against the frame size it negotiated.
		{name: "ContentHeaderAtFrameMax", want: published, msg: withFrame(privateFrameMax)},
		{name: "ContentHeaderOneByteOverFrameMax", want: dead, cause: "16385 bytes, over the frame_max of 16384", msg: withFrame(privateFrameMax + 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			runPoisonCase(t, private(t), c, outboxrabbitmq.Config{})
		})
	}

	t.Run("FrameSizeIsExact", func(t *testing.T) {
		// The size the publisher computes is the broker's. Sent without the publisher's
		// check, a content header frame at frame_max is taken, and one too large makes
		// RabbitMQ close the whole connection, reporting the frame's payload size: the
		// computed size less the 8 bytes of frame header and end. (RabbitMQ 3.x lets a frame
		// run 8 bytes past frame_max; the publisher keeps to the protocol's limit.)
		b := private(t)
		for _, size := range []int{privateFrameMax, privateFrameMax + 9} {
			m := withFrame(size)(b)
			m.ID, m.CreatedAt = uuid.New(), time.Now()
			headers := amqp.Table{"aggregate_type": m.AggregateType, "aggregate_id": m.AggregateID}
			for k, v := range m.Headers {
				headers[k] = v
			}
			conn, err := amqp.Dial(node.URL)
			require.NoError(t, err)
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			ch, err := conn.Channel()
			require.NoError(t, err)
			require.NoError(t, ch.Confirm(false))
			dc, err := ch.PublishWithDeferredConfirm(b.top.Exchange, m.RoutingKey, true, false, amqp.Publishing{
				Headers: headers, ContentType: "application/json", DeliveryMode: amqp.Persistent,
				MessageId: m.ID.String(), Timestamp: m.CreatedAt, Type: m.Type, Body: m.Payload,
			})
			done := make(<-chan struct{})
			if err == nil {
				done = dc.Done()
			} else {
				// The broker may close the connection while the client still writes the
				// body frames: the write fails, and the close says why.
				require.Equal(t, privateFrameMax+9, size, "publish at frame_max: %v", err)
			}
			select {
			case <-done:
				require.Equal(t, privateFrameMax, size, "acked")
				require.True(t, dc.Acked())
			case e := <-closed:
				require.Equal(t, privateFrameMax+9, size, "refused: %v", e)
				require.Equal(t, amqp.FrameError, e.Code, "%v", e)
				require.Contains(t, e.Reason, fmt.Sprintf("frame_too_large,%d,", size-8))
			case <-time.After(10 * time.Second):
				t.Fatal("neither a confirm nor a close")
			}
			_ = conn.Close()
		}
	})

	t.Run("MemoryAlarm", func(t *testing.T) {
		// Under a memory alarm RabbitMQ blocks publishing connections and stops reading
		// from them. The relay must report the broker unavailable within its deadline,
		// publish nothing while it lasts, reconnect at most once, and publish everything
		// once the alarm clears.
		b := private(t)
		ctx := context.Background()
		var connects atomic.Int32
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: node.URL, Logger: testLogger(t), Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
			if c.Up {
				connects.Add(1)
			}
		}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })

		var (
			mu          sync.Mutex
			unavailable time.Time // when the relay first left running
			cause       error
			recovered   bool
			polls       atomic.Int32
		)
		cfg := fastConfig(t)
		cfg.PublishTimeout = 2 * time.Second
		cfg.Hooks.Polled = func(outbox.Poll) { polls.Add(1) }
		cfg.Hooks.StateChanged = func(c outbox.StateChange) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case c.To == outbox.StateBrokerUnavailable && unavailable.IsZero():
				unavailable, cause = time.Now(), c.Err
			case c.From == outbox.StateBrokerUnavailable && c.To == outbox.StateRunning:
				recovered = true
			}
		}
		b.write(t, b.msg("warm-up", 0))
		relay := b.startRelay(t, b.pool, pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 1 }, "warm-up published")

		node.Ctl(t, "set_vm_memory_high_watermark", "0")
		alarmed := true
		defer func() {
			if alarmed {
				node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
			}
		}()
		start := time.Now()
		msgs := make([]outbox.Message, 50)
		for i := range msgs {
			msgs[i] = b.msg(fmt.Sprintf("agg-%d", i), i)
		}
		b.write(t, msgs...)
		testinfra.Eventually(t, cfg.PublishTimeout+5*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return !unavailable.IsZero()
		}, "the relay reports the broker unavailable")
		mu.Lock()
		took, why := unavailable.Sub(start), cause
		mu.Unlock()
		require.ErrorContains(t, why, "low on memory", "the broker's reason reaches the relay")
		require.Less(t, took, cfg.PublishTimeout+time.Second, "the cycle ends within PublishTimeout + 1s")
		t.Logf("broker unavailable %s after the rows were written", took)

		// While the alarm lasts the relay keeps probing; the blocked connection answers at
		// once, and none of it is a reconnect.
		probes := polls.Load()
		testinfra.Eventually(t, waitFor, func() bool { return polls.Load() >= probes+5 }, "the relay probes")
		require.Zero(t, b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'agg-%'"), "nothing is published under the alarm")
		require.Equal(t, outbox.StateBrokerUnavailable, relay.State())
		short, cancel := context.WithTimeout(ctx, cfg.PublishTimeout)
		defer cancel()
		probeStart := time.Now()
		err = pub.Publish(short, []outbox.Message{b.msg("probe", 0)})[0]
		require.ErrorIs(t, err, outbox.ErrUnavailable)
		require.ErrorContains(t, err, "blocks the connection")
		require.Less(t, time.Since(probeStart), 500*time.Millisecond, "a blocked publisher answers at once")

		node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
		alarmed = false
		testinfra.Eventually(t, waitFor, func() bool {
			return b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'agg-%'") == len(msgs)
		}, "everything published after the alarm cleared")
		testinfra.Eventually(t, waitFor, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return recovered
		}, "the relay is running again")
		require.Zero(t, b.count(t, "dead_at IS NOT NULL OR attempts > 0"), "the alarm cost no attempts")
		require.LessOrEqual(t, connects.Load(), int32(2), "no reconnect storm")
		require.GreaterOrEqual(t, queueDepth(t, node.URL, b.top.Queue), 1+len(msgs), "every message reached the queue (at least once)")
	})
}

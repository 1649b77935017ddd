package inboxrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// replayBundle is what a replay test without a consumer works with: a connection for
// ReplayDeadLetters and a channel of the test's own, in confirm mode.
type replayBundle struct {
	amqpURL string
	conn    *amqp.Connection // ReplayDeadLetters's
	ch      *amqp.Channel
}

func setupReplay(t *testing.T) *replayBundle {
	t.Helper()
	b := &replayBundle{amqpURL: testinfra.AMQPURL(t)}
	var err error
	b.conn, err = amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.conn.Close() })
	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.ch.Confirm(false))
	return b
}

// queue declares a durable queue of a unique name with args, deleted when the test ends.
func (b *replayBundle) queue(t *testing.T, prefix string, args amqp.Table) string {
	t.Helper()
	name := testinfra.UniqueName(t, prefix)
	_, err := b.ch.QueueDeclare(name, true, false, false, false, args)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := amqp.Dial(b.amqpURL)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDelete(name, false, false, false)
		require.NoError(t, err)
	})
	return name
}

// put publishes msg into queue through the default exchange and waits for the confirm.
func (b *replayBundle) put(t *testing.T, queue string, msg amqp.Publishing) {
	t.Helper()
	putOn(t, b.ch, queue, msg)
}

func putOn(t *testing.T, ch *amqp.Channel, queue string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, msg)
	require.NoError(t, err)
	acked, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked)
}

// depth returns the ready messages of queue.
func (b *replayBundle) depth(t *testing.T, queue string) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// waitDepth waits until queue holds want ready messages.
func (b *replayBundle) waitDepth(t *testing.T, queue string, want int) {
	t.Helper()
	testinfra.Eventually(t, 20*time.Second, func() bool { return b.depth(t, queue) == want },
		"queue %s never held %d messages", queue, want)
}

// take removes every ready message of queue and returns them in order.
func (b *replayBundle) take(t *testing.T, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// deadLetter is a message as the consumer dead-letters it from queue.
func deadLetter(id, typ, reason, queue string) amqp.Publishing {
	return amqp.Publishing{
		MessageId: id, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Body: []byte(`{"version":1,"order_id":"` + id + `"}`),
		Headers: amqp.Table{
			inboxrabbitmq.HeaderDeadReason:         reason,
			inboxrabbitmq.HeaderOriginalQueue:      queue,
			inboxrabbitmq.HeaderOriginalExchange:   "shop.events",
			inboxrabbitmq.HeaderOriginalRoutingKey: "order.placed",
		},
	}
}

func messageIDs(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.MessageId
	}
	return out
}

func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()

	t.Run("a copy keeps the message and loses the retry and broker headers", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		ts := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
		b.put(t, dead, amqp.Publishing{
			MessageId: "m-1", Type: "order.placed", ContentType: "application/json", ContentEncoding: "identity",
			CorrelationId: "req-42", Timestamp: ts, Priority: 3, AppId: "orders", ReplyTo: "nobody",
			Expiration: "60000", UserId: "guest", DeliveryMode: amqp.Transient,
			Body: []byte(`{"version":1}`),
			Headers: amqp.Table{
				inboxrabbitmq.HeaderDeadReason:         "permanent-error: order.placed version 1 is not supported",
				inboxrabbitmq.HeaderOriginalQueue:      work,
				inboxrabbitmq.HeaderOriginalExchange:   "shop.events",
				inboxrabbitmq.HeaderOriginalRoutingKey: "order.placed",
				inboxrabbitmq.HeaderRetries:            int32(4),
				"x-delivery-count":                     int64(3),
				// Broker headers of an earlier death elsewhere: the header names the queue.
				"x-death":              []any{amqp.Table{"queue": "elsewhere", "reason": "rejected", "count": int64(1)}},
				"x-first-death-queue":  "elsewhere",
				"x-first-death-reason": "rejected",
				"x-last-death-queue":   "elsewhere",
				"traceparent":          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			},
		})

		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.NoError(t, err)
		require.Equal(t, inboxrabbitmq.ReplayReport{
			Queue: dead, Depth: 1, Examined: 1, Matched: 1, Replayed: 1,
			Groups: []inboxrabbitmq.ReplayGroup{{Type: "order.placed", Reason: inboxrabbitmq.ReasonPermanent, OriginalQueue: work,
				Examined: 1, Matched: 1, Replayed: 1}},
		}, report)

		require.Zero(t, b.depth(t, dead))
		got := b.take(t, work)
		require.Len(t, got, 1)
		d := got[0]
		require.Equal(t, "m-1", d.MessageId)
		require.Equal(t, "order.placed", d.Type)
		require.Equal(t, "application/json", d.ContentType)
		require.Equal(t, "identity", d.ContentEncoding)
		require.Equal(t, "req-42", d.CorrelationId)
		require.True(t, ts.Equal(d.Timestamp), d.Timestamp)
		require.Equal(t, uint8(3), d.Priority)
		require.Equal(t, "orders", d.AppId)
		require.Equal(t, "nobody", d.ReplyTo)
		require.Equal(t, amqp.Persistent, d.DeliveryMode)
		require.Empty(t, d.Expiration, "a replayed copy must not expire before the consumer sees it")
		require.Empty(t, d.UserId)
		require.Equal(t, `{"version":1}`, string(d.Body))
		require.Equal(t, amqp.Table{
			inboxrabbitmq.HeaderDeadReason:         "permanent-error: order.placed version 1 is not supported",
			inboxrabbitmq.HeaderOriginalQueue:      work,
			inboxrabbitmq.HeaderOriginalExchange:   "shop.events",
			inboxrabbitmq.HeaderOriginalRoutingKey: "order.placed",
			inboxrabbitmq.HeaderOriginalExpiration: "60000",
			inboxrabbitmq.HeaderOriginalUserID:     "guest",
			inboxrabbitmq.HeaderReplayed:           int32(1),
			"traceparent":                          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		}, d.Headers)
	})

	t.Run("a dead letter of the broker goes back to the queue of its x-death", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead := b.queue(t, "dead", nil)
		work := b.queue(t, "qq", amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": 1,
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
		b.put(t, work, amqp.Publishing{MessageId: "m-1", Type: "order.placed", ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: []byte(`{}`), Headers: amqp.Table{"x-custom": "kept"}})
		// Rejected with requeue until the queue's delivery limit dead-letters it.
		testinfra.Eventually(t, 20*time.Second, func() bool {
			if d, ok, err := b.ch.Get(work, false); err == nil && ok {
				require.NoError(t, d.Nack(false, true))
			}
			return b.depth(t, dead) == 1
		}, "the broker never dead-lettered the message")

		var seen []inboxrabbitmq.DeadLetterMessage
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{
			Queue: dead,
			Match: func(m inboxrabbitmq.DeadLetterMessage) bool { seen = append(seen, m); return true },
		})
		require.NoError(t, err)
		require.Equal(t, 1, report.Replayed)
		require.Len(t, seen, 1)
		require.Equal(t, "broker: delivery_limit", seen[0].Reason)
		require.Equal(t, "broker: delivery_limit", seen[0].ReasonKind())
		require.Equal(t, work, seen[0].OriginalQueue)
		require.Contains(t, seen[0].Headers, "x-death")
		require.Equal(t, []inboxrabbitmq.ReplayGroup{{Type: "order.placed", Reason: "broker: delivery_limit", OriginalQueue: work,
			Examined: 1, Matched: 1, Replayed: 1}}, report.Groups)

		var got amqp.Delivery
		testinfra.Eventually(t, 20*time.Second, func() bool {
			d, ok, err := b.ch.Get(work, true)
			require.NoError(t, err)
			got = d
			return ok
		}, "the copy never reached %s", work)
		require.Equal(t, "m-1", got.MessageId)
		// The quorum queue counts the copy's deliveries from zero.
		if n, ok := got.Headers["x-delivery-count"]; ok {
			require.EqualValues(t, 0, n)
			delete(got.Headers, "x-delivery-count")
		}
		require.Equal(t, amqp.Table{
			"x-custom":                             "kept",
			inboxrabbitmq.HeaderReplayed:           int32(1),
			inboxrabbitmq.HeaderOriginalExchange:   "",
			inboxrabbitmq.HeaderOriginalRoutingKey: work,
		}, got.Headers, "the broker's headers are gone, where it was published is kept")
		require.Zero(t, b.depth(t, dead))
	})

	// The shop's dead-letter queues are quorum queues; the library's example declares a
	// classic one.
	queueTypes := map[string]amqp.Table{"classic": nil, "quorum": {"x-queue-type": "quorum"}}

	for name, args := range queueTypes {
		t.Run("only matched messages move; the others stay, in order/"+name, func(t *testing.T) {
			t.Parallel()
			b := setupReplay(t)
			dead, work := b.queue(t, "dead", args), b.queue(t, "work", nil)
			for i := range 6 {
				typ := "order.placed"
				if i%2 == 1 {
					typ = "order.cancelled"
				}
				b.put(t, dead, deadLetter(fmt.Sprintf("m-%d", i), typ, "permanent-error: no", work))
			}
			report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{
				Queue: dead,
				Match: func(m inboxrabbitmq.DeadLetterMessage) bool { return m.Type == "order.cancelled" },
			})
			require.NoError(t, err)
			require.Equal(t, 6, report.Examined)
			require.Equal(t, 3, report.Matched)
			require.Equal(t, 3, report.Replayed)
			require.Equal(t, 3, report.Left)
			require.Equal(t, []string{"m-1", "m-3", "m-5"}, messageIDs(b.take(t, work)))
			require.Equal(t, []string{"m-0", "m-2", "m-4"}, messageIDs(b.take(t, dead)))
		})
	}

	t.Run("groups by type, reason kind, original queue and label, sorted", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		b.put(t, dead, deadLetter("m-1", "b", "permanent-error: one", work))
		b.put(t, dead, deadLetter("m-2", "b", "permanent-error: two", work))
		b.put(t, dead, deadLetter("m-3", "a", "max-deliveries: failed on all 5 attempts", work))
		b.put(t, dead, amqp.Publishing{MessageId: "m-4", Type: "a", Body: []byte("x")})
		b.put(t, dead, deadLetter("m-5", "b", "permanent-error: three", work))
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{
			Queue: dead, DryRun: true,
			Match:   func(m inboxrabbitmq.DeadLetterMessage) bool { return m.ID != "m-2" },
			GroupBy: func(m inboxrabbitmq.DeadLetterMessage) string { return m.Type + "!" },
		})
		require.NoError(t, err)
		require.Equal(t, []inboxrabbitmq.ReplayGroup{
			{Type: "a", Reason: "", OriginalQueue: "", Label: "a!", Examined: 1, Matched: 1},
			{Type: "a", Reason: inboxrabbitmq.ReasonMaxDeliveries, OriginalQueue: work, Label: "a!", Examined: 1, Matched: 1},
			{Type: "b", Reason: inboxrabbitmq.ReasonPermanent, OriginalQueue: work, Label: "b!", Examined: 3, Matched: 2},
		}, report.Groups)
		require.Equal(t, 1, report.NoOriginalQueue)
	})

	for name, args := range queueTypes {
		t.Run("a dry run counts the same and moves nothing/"+name, func(t *testing.T) {
			t.Parallel()
			b := setupReplay(t)
			dead, work := b.queue(t, "dead", args), b.queue(t, "work", nil)
			for i := range 4 {
				b.put(t, dead, deadLetter(fmt.Sprintf("m-%d", i), "order.placed", "permanent-error: no", work))
			}
			b.put(t, dead, amqp.Publishing{MessageId: "lost", Type: "order.placed"})
			cfg := inboxrabbitmq.ReplayConfig{Queue: dead, DryRun: true,
				Match: func(m inboxrabbitmq.DeadLetterMessage) bool { return m.ID != "m-2" }}
			dry, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, cfg)
			require.NoError(t, err)
			require.Equal(t, inboxrabbitmq.ReplayReport{
				Queue: dead, DryRun: true, Depth: 5, Examined: 5, Matched: 4, NoOriginalQueue: 1, Left: 5,
				Groups: []inboxrabbitmq.ReplayGroup{
					{Type: "order.placed", Examined: 1, Matched: 1},
					{Type: "order.placed", Reason: inboxrabbitmq.ReasonPermanent, OriginalQueue: work, Examined: 4, Matched: 3},
				},
			}, dry)
			// Handed back before it returned, in order, and nothing published.
			require.Equal(t, 5, b.depth(t, dead))
			require.Zero(t, b.depth(t, work))

			cfg.DryRun = false
			real, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, cfg)
			require.NoError(t, err)
			require.Equal(t, 3, real.Replayed)
			require.Equal(t, 2, real.Left)
			for i := range real.Groups {
				real.Groups[i].Replayed = 0
			}
			real.DryRun, real.Replayed, real.Left = true, 0, 5
			require.Equal(t, dry, real, "the replay examined and matched what the dry run said")
			require.Equal(t, []string{"m-0", "m-1", "m-3"}, messageIDs(b.take(t, work)))
			require.Equal(t, []string{"m-2", "lost"}, messageIDs(b.take(t, dead)))
		})
	}

	t.Run("Limit bounds the messages examined", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		for i := range 5 {
			b.put(t, dead, deadLetter(fmt.Sprintf("m-%d", i), "order.placed", "permanent-error: no", work))
		}
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, 5, report.Depth)
		require.Equal(t, 2, report.Examined)
		require.Equal(t, 2, report.Replayed)
		require.Equal(t, 3, report.Left)
		require.Equal(t, []string{"m-0", "m-1"}, messageIDs(b.take(t, work)))
		require.Equal(t, 3, b.depth(t, dead))
	})

	t.Run("messages dead-lettered again during the replay are not examined again", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead := b.queue(t, "dead", nil)
		// Every message expires at once in this queue and comes back to the dead-letter queue.
		bouncer := b.queue(t, "bouncer", amqp.Table{"x-message-ttl": 0,
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
		for i := range 3 {
			b.put(t, dead, deadLetter(fmt.Sprintf("m-%d", i), "order.placed", "permanent-error: no", bouncer))
		}
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.NoError(t, err)
		require.Equal(t, 3, report.Examined)
		require.Equal(t, 3, report.Replayed)
		b.waitDepth(t, dead, 3)
		back := b.take(t, dead)
		require.Equal(t, []string{"m-0", "m-1", "m-2"}, messageIDs(back))
		for _, d := range back {
			require.Contains(t, d.Headers, "x-death", "dead-lettered by the broker this time")
			require.Equal(t, "permanent-error: no", d.Headers[inboxrabbitmq.HeaderDeadReason], "a replay keeps the reason")
			require.EqualValues(t, 1, d.Headers[inboxrabbitmq.HeaderReplayed])
			b.put(t, dead, amqp.Publishing{MessageId: d.MessageId, Type: d.Type, Headers: d.Headers, Body: d.Body})
		}
		// Seen again, they are the broker's dead letters now: a filter on the old reason does
		// not take them back into a loop.
		dry, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead, DryRun: true,
			Match: func(m inboxrabbitmq.DeadLetterMessage) bool { return strings.HasPrefix(m.Reason, "permanent-error") }})
		require.NoError(t, err)
		require.Equal(t, 3, dry.Examined)
		require.Zero(t, dry.Matched)
		require.Equal(t, []inboxrabbitmq.ReplayGroup{{Type: "order.placed", Reason: "broker: expired", OriginalQueue: bouncer, Examined: 3}}, dry.Groups)
	})

	t.Run("a message that names no queue stays", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		b.put(t, dead, amqp.Publishing{MessageId: "orphan", Type: "order.placed", Body: []byte(`{}`)})
		b.put(t, dead, deadLetter("m-1", "order.placed", "permanent-error: no", work))
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.NoError(t, err)
		require.Equal(t, 2, report.Matched)
		require.Equal(t, 1, report.NoOriginalQueue)
		require.Equal(t, 1, report.Replayed)
		require.Equal(t, 1, report.Left)
		require.Equal(t, []string{"m-1"}, messageIDs(b.take(t, work)))
		require.Equal(t, []string{"orphan"}, messageIDs(b.take(t, dead)))
	})

	t.Run("a copy the broker returns leaves its dead letter, and the error names the queue", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		missing := testinfra.UniqueName(t, "missing")
		b.put(t, dead, deadLetter("m-1", "order.placed", "permanent-error: no", missing))
		b.put(t, dead, deadLetter("m-2", "order.placed", "permanent-error: no", work))
		b.put(t, dead, deadLetter("m-3", "order.placed", "permanent-error: no", missing))
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.Error(t, err)
		require.Contains(t, err.Error(), fmt.Sprintf("queue %q (312 NO_ROUTE)", missing))
		require.Contains(t, err.Error(), "2 matched dead letters not replayed")
		require.Equal(t, 2, report.Failed)
		require.Equal(t, []string{missing}, report.Unroutable)
		require.Equal(t, 1, report.Replayed)
		require.Equal(t, []string{"m-2"}, messageIDs(b.take(t, work)))
		require.Equal(t, []string{"m-1", "m-3"}, messageIDs(b.take(t, dead)))
	})

	t.Run("a dry run says which queues do not exist, as the replay would", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		missing := testinfra.UniqueName(t, "missing")
		b.put(t, dead, deadLetter("m-1", "order.placed", "permanent-error: no", missing))
		b.put(t, dead, deadLetter("m-2", "order.placed", "permanent-error: no", work))
		b.put(t, dead, deadLetter("m-3", "order.placed", "permanent-error: no", missing))
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead, DryRun: true})
		require.ErrorContains(t, err, fmt.Sprintf("2 matched dead letters could not be replayed: their queue does not exist: queue %q", missing))
		require.Equal(t, 2, report.Failed)
		require.Equal(t, []string{missing}, report.Unroutable)
		require.Equal(t, 3, report.Matched)
		require.Zero(t, report.Replayed)
		require.Equal(t, 3, b.depth(t, dead), "a dry run moves nothing")
		require.False(t, b.conn.IsClosed(), "a missing queue closes a channel of the replay's, not the caller's connection")
	})

	t.Run("a second replay of the same queue at once is refused, and runs once the first ended", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		b.put(t, dead, deadLetter("m-1", "order.placed", "permanent-error: no", work))
		b.put(t, dead, deadLetter("m-2", "order.placed", "permanent-error: no", work))
		// The first replay is held inside its Match while the second starts.
		inFirst, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		firstDone := make(chan error, 1)
		go func() {
			_, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: dead,
				Match: func(inboxrabbitmq.DeadLetterMessage) bool {
					once.Do(func() { close(inFirst) })
					<-release
					return true
				}})
			firstDone <- err
		}()
		select {
		case <-inFirst:
		case <-time.After(20 * time.Second):
			t.Fatal("the first replay never examined a message")
		}
		other, err := amqp.Dial(b.amqpURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close() })
		for _, dryRun := range []bool{true, false} {
			report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), other, inboxrabbitmq.ReplayConfig{Queue: dead, DryRun: dryRun})
			require.ErrorContains(t, err, "another replay of "+dead+" is running")
			require.Zero(t, report.Examined)
		}
		close(release)
		require.NoError(t, <-firstDone)
		require.Equal(t, []string{"m-1", "m-2"}, messageIDs(b.take(t, work)), "each replayed once")
		// The lock went with the first replay: the next one runs.
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), other, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.NoError(t, err)
		require.Zero(t, report.Examined)
	})

	t.Run("a cancelled replay loses nothing", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		dead, work := b.queue(t, "dead", nil), b.queue(t, "work", nil)
		for i := range 5 {
			b.put(t, dead, deadLetter(fmt.Sprintf("m-%d", i), "order.placed", "permanent-error: no", work))
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		examined := 0
		report, err := inboxrabbitmq.ReplayDeadLetters(ctx, b.conn, inboxrabbitmq.ReplayConfig{
			Queue: dead,
			Match: func(inboxrabbitmq.DeadLetterMessage) bool {
				if examined++; examined == 3 {
					cancel()
				}
				return true
			},
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 3, report.Examined)
		require.Equal(t, 2, report.Replayed)
		b.waitDepth(t, dead, 3)
		require.Equal(t, []string{"m-0", "m-1"}, messageIDs(b.take(t, work)))
		require.Equal(t, []string{"m-2", "m-3", "m-4"}, messageIDs(b.take(t, dead)))
		require.False(t, b.conn.IsClosed(), "the caller's connection stays open")
	})

	t.Run("bad input", func(t *testing.T) {
		t.Parallel()
		b := setupReplay(t)
		_, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{})
		require.ErrorContains(t, err, "inbox: invalid replay config: queue (the dead-letter queue) is required")
		_, err = inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: "q", Limit: -1})
		require.ErrorContains(t, err, "limit must be >= 0")
		_, err = inboxrabbitmq.ReplayDeadLetters(t.Context(), nil, inboxrabbitmq.ReplayConfig{Queue: "q"})
		require.ErrorContains(t, err, "no connection")

		missing := testinfra.UniqueName(t, "missing")
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), b.conn, inboxrabbitmq.ReplayConfig{Queue: missing})
		require.EqualError(t, err, fmt.Sprintf("inbox: replay dead letters of %[1]s: queue %[1]q does not exist", missing))
		require.Zero(t, report.Examined)
		require.False(t, b.conn.IsClosed(), "a missing queue closes a channel, not the connection")

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		dead := b.queue(t, "dead", nil)
		b.put(t, dead, deadLetter("m-1", "order.placed", "permanent-error: no", "work"))
		_, err = inboxrabbitmq.ReplayDeadLetters(ctx, b.conn, inboxrabbitmq.ReplayConfig{Queue: dead})
		require.ErrorIs(t, err, context.Canceled)
		b.waitDepth(t, dead, 1)
	})
}

// TestReplayDeadLettersThroughConsumer runs a consumer whose handler refuses two types of
// message, then fixes it and replays the dead letters of one type: each is handled once,
// with its original routing key and a fresh set of attempts, and the others stay untouched.
func TestReplayDeadLettersThroughConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		fixed atomic.Bool
		mu    sync.Mutex
		seen  = map[string]inboxrabbitmq.Delivery{} // the last delivery handled without error, by id
	)
	handler := func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
		if d.Type != "order.placed" && !fixed.Load() {
			return inbox.Permanent(fmt.Errorf("%s is not supported yet", d.Type))
		}
		if err := recordEffect(ctx, tx, d); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		seen[d.ID] = d
		return nil
	}
	b.run(t, b.config(handler))

	event := func(id, typ string) amqp.Publishing {
		p := jsonMessage(id)
		p.Type = typ
		return p
	}
	for i := range 2 {
		b.publish(t, event(fmt.Sprintf("p-%d", i), "order.placed"))
	}
	for i := range 3 {
		b.publish(t, event(fmt.Sprintf("c-%d", i), "order.cancelled"))
	}
	for i := range 2 {
		b.publish(t, event(fmt.Sprintf("s-%d", i), "order.shipped"))
	}
	testinfra.Eventually(t, 30*time.Second, func() bool {
		dead, _ := b.queueState(t, b.dead.Queue)
		processed, _ := b.events.counts()
		return dead == 5 && processed == 2
	}, "the refused messages were not dead-lettered")

	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	cancelled := func(m inboxrabbitmq.DeadLetterMessage) bool { return m.Type == "order.cancelled" }
	before := map[string]inboxrabbitmq.DeadLetterMessage{}
	dry, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), conn, inboxrabbitmq.ReplayConfig{
		Queue: b.dead.Queue, DryRun: true,
		Match: func(m inboxrabbitmq.DeadLetterMessage) bool { before[m.ID] = m; return cancelled(m) },
	})
	require.NoError(t, err)
	groups := []inboxrabbitmq.ReplayGroup{
		{Type: "order.cancelled", Reason: inboxrabbitmq.ReasonPermanent, OriginalQueue: b.top.Queue, Examined: 3, Matched: 3},
		{Type: "order.shipped", Reason: inboxrabbitmq.ReasonPermanent, OriginalQueue: b.top.Queue, Examined: 2},
	}
	require.Equal(t, inboxrabbitmq.ReplayReport{Queue: b.dead.Queue, DryRun: true, Depth: 5, Examined: 5, Matched: 3, Left: 5,
		Groups: groups}, dry)
	require.Len(t, before, 5)
	dead, _ := b.queueState(t, b.dead.Queue)
	require.Equal(t, 5, dead, "a dry run moves nothing")
	for i := range 3 {
		require.Zero(t, b.effects(t, fmt.Sprintf("c-%d", i)))
	}

	fixed.Store(true)
	report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), conn, inboxrabbitmq.ReplayConfig{Queue: b.dead.Queue, Match: cancelled})
	require.NoError(t, err)
	groups[0].Replayed = 3
	require.Equal(t, inboxrabbitmq.ReplayReport{Queue: b.dead.Queue, Depth: 5, Examined: 5, Matched: 3, Replayed: 3, Left: 2,
		Groups: groups}, report)

	testinfra.Eventually(t, 30*time.Second, func() bool {
		processed, _ := b.events.counts()
		return processed == 5
	}, "the replayed messages were not processed")
	for i := range 3 {
		id := fmt.Sprintf("c-%d", i)
		require.Equal(t, 1, b.effects(t, id), id)
		mu.Lock()
		d := seen[id]
		mu.Unlock()
		require.Equal(t, routingKey, d.RoutingKey, "the handler sees the original routing key")
		require.Equal(t, b.top.Exchange, d.Exchange)
		require.Equal(t, 1, d.DeliveryCount, "a replay starts with a fresh set of attempts")
	}
	for i := range 2 {
		require.Zero(t, b.effects(t, fmt.Sprintf("s-%d", i)))
	}

	// The others are still there, as they were.
	after := map[string]inboxrabbitmq.DeadLetterMessage{}
	rest, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), conn, inboxrabbitmq.ReplayConfig{
		Queue: b.dead.Queue, DryRun: true,
		Match: func(m inboxrabbitmq.DeadLetterMessage) bool { after[m.ID] = m; return true },
	})
	require.NoError(t, err)
	require.Equal(t, 2, rest.Examined)
	require.Equal(t, []string{"s-0", "s-1"}, slices.Sorted(maps.Keys(after)))
	for id, m := range after {
		require.Equal(t, before[id], m, id)
	}
	processed, duplicates := b.events.counts()
	require.Equal(t, 5, processed)
	require.Zero(t, duplicates)
	require.Len(t, b.events.deadReasons(), 5, "nothing was dead-lettered again")
}

// TestReplayDeadLettersTwice replays a dead letter, then the same dead letter again, as a
// crash between the broker's confirm and the acknowledgement leaves it: the inbox takes the
// second copy as a duplicate, and the handler's effect happens once.
func TestReplayDeadLettersTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fixed atomic.Bool
	b.run(t, b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
		if !fixed.Load() {
			return inbox.Permanent(errors.New("not yet"))
		}
		return recordEffect(ctx, tx, d)
	}))
	b.publish(t, jsonMessage("m-1"))
	testinfra.Eventually(t, 30*time.Second, func() bool {
		dead, _ := b.queueState(t, b.dead.Queue)
		return dead == 1
	}, "the message was not dead-lettered")

	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	var kept amqp.Delivery
	testinfra.Eventually(t, 10*time.Second, func() bool {
		d, ok, err := b.ch.Get(b.dead.Queue, false) // a copy of the dead letter, handed back below
		require.NoError(t, err)
		kept = d
		return ok
	}, "no dead letter")
	require.NoError(t, kept.Nack(false, true))

	fixed.Store(true)
	for round := 1; round <= 2; round++ {
		if round == 2 {
			// The dead letter is back, as if the acknowledgement after the confirm was lost.
			putOn(t, b.ch, b.dead.Queue, amqp.Publishing{MessageId: kept.MessageId, Type: kept.Type,
				ContentType: kept.ContentType, DeliveryMode: amqp.Persistent, Headers: kept.Headers, Body: kept.Body})
		}
		report, err := inboxrabbitmq.ReplayDeadLetters(t.Context(), conn, inboxrabbitmq.ReplayConfig{Queue: b.dead.Queue})
		require.NoError(t, err)
		require.Equal(t, 1, report.Replayed, "round %d", round)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed+duplicates == round
		}, "round %d: the copy was not handled", round)
	}
	processed, duplicates := b.events.counts()
	require.Equal(t, 1, processed)
	require.Equal(t, 1, duplicates)
	require.Equal(t, 1, b.effects(t, "m-1"))
}

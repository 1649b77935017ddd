package inboxrabbitmq

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestOutlastsHold(t *testing.T) {
	t.Parallel()
	const maxHold = 15 * time.Minute
	for name, tc := range map[string]struct {
		since, delay time.Duration
		want         bool
	}{
		"JustArrived":       {0, time.Second, false},
		"EndsAtTheLimit":    {maxHold - time.Second, time.Second, false},
		"EndsPastTheLimit":  {maxHold - time.Second, time.Second + 1, true},
		"ArrivedLongAgo":    {maxHold, 0, false},
		"PastTheLimit":      {maxHold + 1, 0, true},
		"LongWaitFromStart": {0, maxHold + 1, true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, outlastsHold(tc.since, tc.delay, maxHold))
		})
	}
}

func TestHandBackWay(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		stopping, sessionEnded, workEnded bool
		want                              string
	}{
		"HoldLimit":                 {false, false, false, HandBackHoldLimit},
		"Stop":                      {true, true, false, HandBackShutdown},
		"StopBeforeTheSessionSawIt": {true, false, false, HandBackShutdown},
		"ConnectionLost":            {false, true, false, HandBackRequeued},
		"StopTimedOut":              {true, true, true, HandBackRequeued},
		"ConnectionLostTimedOut":    {false, true, true, HandBackRequeued},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, handBackWay(tc.stopping, tc.sessionEnded, tc.workEnded))
		})
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		retry, maxRetry time.Duration
		// want[n-1] is the largest wait before the copy of the n-th attempt; each wait is
		// jittered down to at most half of it.
		want []time.Duration
	}{
		"Defaults": {DefaultRetryBaseDelay, DefaultRetryMaxDelay,
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}},
		"EqualBounds": {time.Minute, time.Minute, []time.Duration{time.Minute, time.Minute}},
		"Short":       {10 * time.Millisecond, 25 * time.Millisecond, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := &Consumer{cfg: Config{RetryBaseDelay: tc.retry, RetryMaxDelay: tc.maxRetry}}
			for range 20 {
				for i, want := range tc.want {
					got := c.retryDelay(i + 1)
					require.LessOrEqual(t, got, want, "attempt %d", i+1)
					require.GreaterOrEqual(t, got, want/2, "attempt %d", i+1)
				}
			}
		})
	}
}

func TestDeadReasonText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "max-deliveries: boom", deadReasonText(ReasonMaxDeliveries, "boom"))

	// A long detail is cut to maxReasonLen bytes, and never inside a UTF-8 sequence.
	long := deadReasonText(ReasonPermanent, strings.Repeat("é", maxReasonLen))
	require.LessOrEqual(t, len(long), maxReasonLen)
	require.Greater(t, len(long), maxReasonLen-utf8.UTFMax)
	require.True(t, utf8.ValidString(long))
	require.True(t, strings.HasPrefix(long, ReasonPermanent+": é"))
}

func TestCopies(t *testing.T) {
	t.Parallel()
	d := amqp.Delivery{
		Headers:     amqp.Table{"tenant": "acme", HeaderRetries: int32(1)},
		ContentType: "application/json", DeliveryMode: amqp.Transient, Priority: 3, CorrelationId: "c",
		ReplyTo: "r", Expiration: "60000", MessageId: "m", Timestamp: time.Unix(1700000000, 0), Type: "order.placed",
		UserId: "guest", AppId: "orders", Body: []byte(`{}`),
		Exchange: "", RoutingKey: "q",
	}
	del := Delivery{Exchange: "orders", RoutingKey: "orders.placed"}

	t.Run("CopyOfKeepsPropertiesAndRoute", func(t *testing.T) {
		t.Parallel()
		p := copyOf(d, del, "guest")
		require.Equal(t, amqp.Table{
			"tenant": "acme", HeaderRetries: int32(1),
			HeaderOriginalExchange: "orders", HeaderOriginalRoutingKey: "orders.placed",
		}, p.Headers)
		require.Equal(t, amqp.Publishing{
			Headers: p.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
			CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId,
			Timestamp: d.Timestamp, Type: d.Type, UserId: "guest", AppId: d.AppId, Body: d.Body,
		}, p)
		p.Headers["changed"] = true
		require.NotContains(t, d.Headers, "changed", "the copy shares the delivery's headers")
	})

	t.Run("CopyOfMovesAnotherUsersID", func(t *testing.T) {
		t.Parallel()
		p := copyOf(d, del, "inbox")
		require.Empty(t, p.UserId)
		require.Equal(t, "guest", p.Headers[HeaderOriginalUserID])
	})

	t.Run("AsDeadLetter", func(t *testing.T) {
		t.Parallel()
		p := copyOf(d, del, "guest")
		asDeadLetter(&p, "permanent-error: bad", "orders-q")
		require.Equal(t, "permanent-error: bad", p.Headers[HeaderDeadReason])
		require.Equal(t, "orders-q", p.Headers[HeaderOriginalQueue])
		require.Equal(t, "60000", p.Headers[HeaderOriginalExpiration])
		require.Empty(t, p.Expiration, "a dead letter must not expire")
		require.Equal(t, amqp.Persistent, p.DeliveryMode)
	})

	t.Run("AsDeadLetterWithoutExpiration", func(t *testing.T) {
		t.Parallel()
		p := copyOf(amqp.Delivery{MessageId: "m"}, Delivery{}, "guest")
		asDeadLetter(&p, "unknown-type: x", "q")
		require.NotContains(t, p.Headers, HeaderOriginalExpiration)
		require.Equal(t, amqp.Persistent, p.DeliveryMode)
	})
}

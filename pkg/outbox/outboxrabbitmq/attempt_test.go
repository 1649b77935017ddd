package outboxrabbitmq

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func TestDecide(t *testing.T) {
	t.Parallel()

	// What decide may say of one message.
	const (
		published  = "published"
		unroutable = "unroutable"
		refused    = "nacked"
		unsettled  = "unsettled"
	)

	var (
		ack        = answer{confirm: confirmAck}
		nack       = answer{confirm: confirmNack}
		pending    = answer{confirm: confirmPending}
		notSent    = answer{confirm: confirmNotSent}
		noRoute    = answer{confirm: confirmAck, returned: "312 NO_ROUTE"}
		softClose  = &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200 is larger than configured max size 100", Server: true, Recover: true}
		notFound   = &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'", Server: true, Recover: true}
		hardClose  = &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", Server: true, Recover: false}
		frameError = &amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR", Server: true, Recover: false}
	)

	tests := map[string]struct {
		o    observation
		want []string // per message: published, unroutable, nacked or unsettled
		// wantUnavailable is in the error of the unsettled messages, which wraps
		// outbox.ErrUnavailable; empty when a message is to blame (the search follows).
		wantUnavailable string
		wantIsolate     bool
		wantTimedOut    bool
		wantStale       bool
	}{
		"EveryMessageAcked": {
			o:    observation{answers: []answer{ack, ack, ack}, connOpen: true},
			want: []string{published, published, published},
		},
		"ReturnedThenAcked": {
			o:    observation{answers: []answer{ack, noRoute, ack}, connOpen: true},
			want: []string{published, unroutable, published},
		},
		"NackedOnAnOpenChannel": {
			o:         observation{answers: []answer{ack, nack, ack}, connOpen: true},
			want:      []string{published, refused, published},
			wantStale: true,
		},
		"NackWithTheChannelClosedIsTheLibrarys": {
			// amqp091-go nacks what is pending when the channel closes; the broker named
			// no message: the search finds it.
			o: observation{
				answers:  []answer{ack, nack, nack},
				closeErr: softClose, chClosed: true, connOpen: true,
			},
			want:        []string{published, unsettled, unsettled},
			wantIsolate: true,
			wantStale:   true,
		},
		"NackWithTheChannelClosedButItsCloseNotRead": {
			// The guard closed the socket while the attempt observed: the nacks are the
			// library's, and the connection is gone.
			o: observation{
				answers:  []answer{nack, nack},
				chClosed: true, connOpen: false,
			},
			want:            []string{unsettled, unsettled},
			wantUnavailable: "connection closed",
			wantStale:       true,
		},
		"ExchangeNotFound": {
			o: observation{
				answers:  []answer{ack, nack, notSent},
				closeErr: notFound, chClosed: true, connOpen: true,
			},
			want:        []string{published, unsettled, unsettled},
			wantIsolate: true,
			wantStale:   true,
		},
		"NoConfirmBeforeTheDeadline": {
			o: observation{
				answers:  []answer{ack, pending, pending},
				timedOut: true, ctxErr: context.DeadlineExceeded, connOpen: true,
			},
			want:            []string{published, unsettled, unsettled},
			wantUnavailable: "no confirm within the deadline: context deadline exceeded",
			wantTimedOut:    true,
			wantStale:       true,
		},
		"DeadlinePassedJustAfterTheWait": {
			o: observation{
				answers: []answer{ack, notSent},
				ctxErr:  context.DeadlineExceeded, connOpen: true,
			},
			want:            []string{published, unsettled},
			wantUnavailable: "no confirm within the deadline",
			wantTimedOut:    true,
			wantStale:       true,
		},
		"DeadlinePassedWithEverythingSettled": {
			// Nothing is owed: the connection is not to be dropped.
			o:    observation{answers: []answer{ack, noRoute}, ctxErr: context.DeadlineExceeded, connOpen: true},
			want: []string{published, unroutable},
		},
		"BlockedBeforeSending": {
			o: observation{
				answers: []answer{notSent, notSent},
				blocked: true, blockedReason: "low on memory", connOpen: true,
			},
			want:            []string{unsettled, unsettled},
			wantUnavailable: "the broker blocked the connection: low on memory",
			wantStale:       true,
		},
		"BlockedWhileWaitingAndThenTheDeadline": {
			// The block is the cause, not the deadline it made pass.
			o: observation{
				answers: []answer{ack, pending},
				blocked: true, blockedReason: "low on disk", ctxErr: context.DeadlineExceeded, connOpen: true,
			},
			want:            []string{published, unsettled},
			wantUnavailable: "the broker blocked the connection: low on disk",
			wantTimedOut:    true,
			wantStale:       true,
		},
		"ConnectionLost": {
			o: observation{
				answers:  []answer{ack, nack, notSent},
				closeErr: hardClose, chClosed: true, connOpen: false,
			},
			want:            []string{published, unsettled, unsettled},
			wantUnavailable: "connection closed: Exception (320)",
			wantStale:       true,
		},
		"ChannelClosedByTheLibrary": {
			o: observation{
				answers:  []answer{notSent},
				chClosed: true, connOpen: true,
			},
			want:            []string{unsettled},
			wantUnavailable: "channel closed: <nil>",
			wantStale:       true,
		},
		"HardErrorOnAnOpenConnection": {
			o: observation{
				answers:  []answer{nack},
				closeErr: frameError, chClosed: true, connOpen: true,
			},
			want:            []string{unsettled},
			wantUnavailable: "channel closed: Exception (501)",
			wantStale:       true,
		},
		"PublishFailedOnAChannelStillOpen": {
			o:               observation{answers: []answer{ack, notSent}, connOpen: true},
			want:            []string{published, unsettled},
			wantUnavailable: "channel closed: <nil>",
			wantStale:       true,
		},
		"Empty": {
			o: observation{connOpen: true},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := decide(tt.o)

			got := make([]string, len(tt.o.answers))
			for j := range got {
				var err error
				if v.errs != nil {
					err = v.errs[j]
				}
				switch {
				case err == nil:
					got[j] = published
				case errors.Is(err, ErrUnroutable):
					require.ErrorContains(t, err, tt.o.answers[j].returned)
					got[j] = unroutable
				case errors.Is(err, ErrNacked):
					require.ErrorIs(t, err, outbox.ErrRefused, "a nack counts no attempt")
					got[j] = refused
				default:
					t.Fatalf("message %d: unexpected error %v", j, err)
				}
			}
			for _, j := range v.unsettled {
				require.Equal(t, published, got[j], "message %d is unsettled and has a verdict", j)
				got[j] = unsettled
			}
			if len(tt.want) == 0 {
				require.Empty(t, got)
			} else {
				require.Equal(t, tt.want, got)
			}

			if tt.wantUnavailable == "" {
				require.NoError(t, v.unavailable)
			} else {
				require.ErrorIs(t, v.unavailable, outbox.ErrUnavailable)
				require.ErrorContains(t, v.unavailable, tt.wantUnavailable)
			}
			require.Equal(t, tt.wantIsolate, v.isolate(), "isolate")
			require.Equal(t, tt.wantTimedOut, v.timedOut, "timedOut")
			require.Equal(t, tt.wantStale, v.stale, "stale")
			require.Equal(t, tt.o.closeErr, v.closeErr)
			require.Equal(t, tt.o.connOpen, v.connOpen)
		})
	}
}

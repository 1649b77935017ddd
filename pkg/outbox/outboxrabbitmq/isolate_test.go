package outboxrabbitmq

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// scriptedBroker stands in for the IO of lane.isolate's send: it refuses some messages by
// closing the channel, as RabbitMQ does, and runs out of time or loses the connection after a
// number of sends.
type scriptedBroker struct {
	refuses map[int]bool
	// sendsInTime is how many sends start before the deadline; lostAt is the send (from 1)
	// during which the connection is lost; 0: never.
	sendsInTime, lostAt int

	sends [][]int
}

var (
	errOutOfTime = errors.New("out of time")
	errLost      = fmt.Errorf("%w: connection closed", outbox.ErrUnavailable)
	errRefused   = errors.New("refused")
)

// send mirrors lane.isolate's send: attempt some, then searchGoesOn. Messages before the
// first refused one are acked; the close leaves it and every one after unsettled.
func (b *scriptedBroker) send(errs []error) func(some []int) (attemptResult, bool) {
	return func(some []int) (attemptResult, bool) {
		b.sends = append(b.sends, slices.Clone(some))
		if len(b.sends) > b.sendsInTime {
			fill(errs, some, errOutOfTime)
			return attemptResult{}, false
		}
		var a attemptResult
		switch k := slices.IndexFunc(some, func(i int) bool { return b.refuses[i] }); {
		case len(b.sends) == b.lostAt:
			a = attemptResult{unsettled: slices.Clone(some), unavailable: errLost}
		case k >= 0:
			a = attemptResult{unsettled: slices.Clone(some[k:]), closeErr: &amqp.Error{Code: amqp.PreconditionFailed, Server: true, Recover: true}, connOpen: true}
		}
		goOn, err := a.searchGoesOn(errOutOfTime)
		if !goOn {
			fill(errs, a.unsettled, err)
		}
		return a, goOn
	}
}

func TestFindRefused(t *testing.T) {
	t.Parallel()

	tests := map[string]struct {
		idx         []int
		refuses     []int
		sendsInTime int
		lostAt      int
		wantSends   [][]int
		wantErrs    map[int]error // the others are published
	}{
		"NoneRefusedAlone": {
			// The close was the broker's own: every message goes alone, and all are confirmed.
			idx:         []int{0, 1, 2},
			sendsInTime: 10,
			wantSends:   [][]int{{0}, {1}, {2}},
		},
		"OneRefusedThenTheRestTogether": {
			idx: []int{0, 1, 2, 3}, refuses: []int{1}, sendsInTime: 10,
			wantSends: [][]int{{0}, {1}, {2, 3}},
			wantErrs:  map[int]error{1: errRefused},
		},
		"TheLastOneRefused": {
			idx: []int{0, 1, 2}, refuses: []int{2}, sendsInTime: 10,
			wantSends: [][]int{{0}, {1}, {2}},
			wantErrs:  map[int]error{2: errRefused},
		},
		"TheRestClosesTheChannelAgain": {
			idx: []int{0, 1, 2, 3, 4}, refuses: []int{1, 3}, sendsInTime: 10,
			wantSends: [][]int{{0}, {1}, {2, 3, 4}, {3}, {4}},
			wantErrs:  map[int]error{1: errRefused, 3: errRefused},
		},
		"OnlySomeOfABatch": {
			// isolate is given the unsettled messages of a batch, not the whole batch.
			idx: []int{3, 5, 8}, refuses: []int{5}, sendsInTime: 10,
			wantSends: [][]int{{3}, {5}, {8}},
			wantErrs:  map[int]error{5: errRefused},
		},
		"OutOfTimeWhileSendingAlone": {
			idx: []int{0, 1, 2, 3, 4}, refuses: []int{2}, sendsInTime: 2,
			wantSends: [][]int{{0}, {1}, {2}},
			wantErrs:  map[int]error{2: errOutOfTime, 3: errOutOfTime, 4: errOutOfTime},
		},
		"OutOfTimeSendingTheRest": {
			idx: []int{0, 1, 2}, refuses: []int{0}, sendsInTime: 1,
			wantSends: [][]int{{0}, {1, 2}},
			wantErrs:  map[int]error{0: errRefused, 1: errOutOfTime, 2: errOutOfTime},
		},
		"ConnectionLostWhileSendingAlone": {
			idx: []int{0, 1, 2}, refuses: []int{2}, sendsInTime: 10, lostAt: 2,
			wantSends: [][]int{{0}, {1}},
			wantErrs:  map[int]error{1: errLost, 2: errLost},
		},
		"ConnectionLostSendingTheRest": {
			idx: []int{0, 1, 2}, refuses: []int{0}, sendsInTime: 10, lostAt: 2,
			wantSends: [][]int{{0}, {1, 2}},
			wantErrs:  map[int]error{0: errRefused, 1: errLost, 2: errLost},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := &scriptedBroker{refuses: map[int]bool{}, sendsInTime: tt.sendsInTime, lostAt: tt.lostAt}
			for _, i := range tt.refuses {
				b.refuses[i] = true
			}
			errs := make([]error, slices.Max(tt.idx)+1)
			var charged []int
			findRefused(tt.idx, errs, b.send(errs), func(i int, a attemptResult) {
				require.True(t, a.isolate(), "charged only for a close that blames a message")
				charged = append(charged, i)
				errs[i] = errRefused
			})
			require.Equal(t, tt.wantSends, b.sends)
			for i, err := range errs {
				require.Equal(t, tt.wantErrs[i], err, "message %d", i)
			}
			for _, i := range charged {
				require.True(t, b.refuses[i], "message %d charged but not refused", i)
			}
		})
	}
}

func TestSearchGoesOn(t *testing.T) {
	t.Parallel()

	soft := &amqp.Error{Code: amqp.NotFound, Server: true, Recover: true}
	deadline := fmt.Errorf("%w: no confirm within the deadline", outbox.ErrUnavailable)
	tests := map[string]struct {
		a       attemptResult
		goOn    bool
		wantErr error
	}{
		"AllSettled":            {a: attemptResult{connOpen: true}, goOn: true},
		"ChannelClosedAgain":    {a: attemptResult{unsettled: []int{1}, closeErr: soft, connOpen: true}, goOn: true},
		"OutOfTimeOnAnOpenConn": {a: attemptResult{unsettled: []int{1}, timedOut: true, connOpen: true, unavailable: deadline}, wantErr: errOutOfTime},
		"OutOfTimeConnLost":     {a: attemptResult{unsettled: []int{1}, timedOut: true, unavailable: deadline}, wantErr: deadline},
		"ConnectionLost":        {a: attemptResult{unsettled: []int{1}, closeErr: soft, unavailable: errLost}, wantErr: errLost},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			goOn, err := tt.a.searchGoesOn(errOutOfTime)
			require.Equal(t, tt.goOn, goOn)
			require.Equal(t, tt.wantErr, err)
		})
	}
}

func TestRefusal(t *testing.T) {
	t.Parallel()

	tests := map[string]struct {
		e         *amqp.Error
		permanent bool
	}{
		"InvalidMessage":   {e: &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - invalid message"}, permanent: true},
		"MessageSize":      {e: &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"}, permanent: true},
		"ExchangeNotFound": {e: &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'"}},
		"AccessRefused":    {e: &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := refusal(tt.e)
			require.Equal(t, tt.permanent, outbox.IsPermanent(err))
			require.ErrorContains(t, err, fmt.Sprintf("%d %s", tt.e.Code, tt.e.Reason))
		})
	}
}

func TestSearchDeadline(t *testing.T) {
	t.Parallel()

	d := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		left time.Duration
		want time.Time
	}{
		"ATenthOfWhatIsLeft": {left: time.Second, want: d.Add(-100 * time.Millisecond)},
		"AtMostTheMargin":    {left: 10 * time.Second, want: d.Add(-isolateMargin)},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, searchDeadline(d, tt.left))
		})
	}
}

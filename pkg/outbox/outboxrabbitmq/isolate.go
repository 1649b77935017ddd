package outboxrabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// isolateMargin is how long before the deadline the search for a refused message stops.
const isolateMargin = 250 * time.Millisecond

// isolate finds the messages of msgs[idx] the broker refuses, after it closed a channel over
// one or more of them without naming which. The search is [findRefused]; this gives it its
// IO: every send goes out on an open channel of the current connection. Whatever the deadline leaves undone is outbox.ErrNotSent: the broker is fine, and no
// fault of those messages is known.
//
// The search stops a little before ctx's deadline ([searchDeadline]), so that running out of
// time leaves the connection open: the guard closes the socket only when the deadline itself
// passes.
func (l *lane) isolate(ctx context.Context, msgs []outbox.Message, idx []int, errs []error, first *amqp.Error) {
	l.cfg.Logger.WarnContext(ctx, "rabbitmq publisher: the broker closed the channel without naming a message; publishing the unconfirmed ones one at a time",
		"connection_name", l.cfg.ConnectionName, "reason", first, "unconfirmed", len(idx))
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, searchDeadline(d, time.Until(d)))
		defer cancel()
	}
	outOfTime := fmt.Errorf("%w: the deadline passed while looking for the message the broker refused (%v)", outbox.ErrNotSent, first)
	send := func(some []int) (attemptResult, bool) {
		if ctx.Err() != nil {
			fill(errs, some, outOfTime)
			return attemptResult{}, false
		}
		if err := l.ensureChannel(ctx); err != nil {
			fill(errs, some, unavailable(ctx, err))
			return attemptResult{}, false
		}
		a := l.attempt(ctx, msgs, some, errs)
		goOn, err := a.searchGoesOn(outOfTime)
		if !goOn {
			fill(errs, a.unsettled, err)
		}
		return a, goOn
	}
	charge := func(i int, a attemptResult) {
		errs[i] = refusal(a.closeErr)
		l.cfg.Logger.WarnContext(ctx, "rabbitmq publisher: the broker refused a message",
			"message_id", msgs[i].ID, "message_type", msgs[i].Type, "aggregate_id", msgs[i].AggregateID, "error", errs[i])
	}
	findRefused(idx, errs, send, charge)
}

// searchDeadline is when the search for a refused message stops, for a call whose deadline d
// is left away: a tenth of that before it, and at most isolateMargin.
func searchDeadline(d time.Time, left time.Duration) time.Time {
	return d.Add(-min(left/10, isolateMargin))
}

// findRefused is the search of [lane.isolate], apart from its IO. It publishes the messages
// of idx one at a time with send, until one makes the broker close the channel: that one is
// given to charge; the others were settled by their own confirms. Then it sends the rest
// together again, and searches again among them if the broker closes that channel too: one
// refused message costs a round trip per message before it, and one batch.
//
// send publishes some messages on an open channel, and reports what the broker left
// unsettled and whether the search is to go on; when it is not, send has set errs for every
// message of some left without a verdict, and findRefused gives the messages it has not sent
// yet the error of the one that stopped it.
func findRefused(idx []int, errs []error, send func(some []int) (attemptResult, bool), charge func(i int, a attemptResult)) {
	for len(idx) > 0 {
		refused := -1
		for k, i := range idx {
			a, ok := send(idx[k : k+1])
			if !ok {
				fill(errs, idx[k+1:], errs[i])
				return
			}
			if len(a.unsettled) > 0 {
				charge(i, a)
				refused = k
				break
			}
		}
		if refused < 0 || refused == len(idx)-1 {
			return
		}
		a, ok := send(idx[refused+1:])
		if !ok || len(a.unsettled) == 0 {
			return
		}
		idx = a.unsettled // the broker closed this channel too: search among these
	}
}

// searchGoesOn reports whether the search for a refused message goes on after attempt a:
// every message was settled, or the broker closed the channel over one of them again. When it
// stops, err is for a's unsettled messages: outOfTime if the deadline passed with the
// connection open, else a's own.
func (a attemptResult) searchGoesOn(outOfTime error) (goOn bool, err error) {
	switch {
	case len(a.unsettled) == 0, a.isolate():
		return true, nil
	case a.timedOut && a.connOpen:
		return false, outOfTime
	default:
		return false, a.unavailable
	}
}

// refusal is the error of a message the broker closed the channel over. 406
// PRECONDITION_FAILED on a publish is about the message itself (RabbitMQ: "invalid message",
// "message size … is larger than …"): no retry can help. Anything else (404 NOT_FOUND for an
// exchange, 403 ACCESS_REFUSED) may be repaired by declaring or granting, so the row's
// attempts count as usual.
func refusal(e *amqp.Error) error {
	err := fmt.Errorf("the broker closed the channel over this message: %d %s", e.Code, e.Reason)
	if e.Code == amqp.PreconditionFailed {
		return outbox.Permanent(err)
	}
	return err
}

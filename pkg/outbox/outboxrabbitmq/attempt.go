package outboxrabbitmq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// attemptResult is what one attempt left unsettled, and why.
type attemptResult struct {
	// unsettled are the messages that got no verdict of the broker: unconfirmed, not sent,
	// or nacked by amqp091-go itself when the channel closed.
	unsettled []int
	// closeErr is why the channel closed, when it closed.
	closeErr *amqp.Error
	// connOpen is whether the connection was still usable afterwards.
	connOpen bool
	// timedOut is whether ctx ended before every confirm came.
	timedOut bool
	// unavailable is the error for the unsettled messages when the cause is the broker or
	// the connection.
	unavailable error
}

// isolate reports whether the unsettled messages are to be published one at a time to find
// the one the broker refused: the broker closed the channel with a soft error (the
// connection is fine) and named no message.
func (a attemptResult) isolate() bool {
	return a.unavailable == nil && a.closeErr != nil && a.connOpen
}

// attempt publishes msgs[idx] on the current channel, waits for their confirms, and sets
// errs for every message the broker settled: acked (nil or unroutable) or nacked. It runs in
// phases: send, await the confirms, observe what came of them, and decide the verdicts, the
// last a pure function of what the others saw ([decide]).
func (l *lane) attempt(ctx context.Context, msgs []outbox.Message, idx []int, errs []error) attemptResult {
	f := newFlight(l.ch, l.sess, len(idx))
	f.send(ctx, msgs, idx)
	f.await(ctx)
	v := decide(f.observe(ctx, msgs, idx, &l.guard))
	if v.stale {
		l.ch.stale = true
	}
	for j, err := range v.errs {
		if err != nil {
			errs[idx[j]] = err
		}
	}
	res := v.attemptResult
	for k, j := range res.unsettled {
		res.unsettled[k] = idx[j]
	}
	return res
}

// flight is one attempt under way on a channel: what it sent, and what the channel said so
// far.
type flight struct {
	c *channel
	s *session
	// confirms holds the deferred confirm of each message of the attempt, by position; the
	// first sent were sent, the others not.
	confirms []*amqp.DeferredConfirmation
	sent     int
	// returns is c.returns until amqp091-go closes it, then nil: a closed channel would be
	// read for ever.
	returns  chan amqp.Return
	returned map[string]string // the reply of each basic.return read, by message-id
	// closed is c.closed until its notification is read (closedSeen), then nil.
	closed     chan *amqp.Error
	closedSeen bool
	closeErr   *amqp.Error
	// timedOut is set when ctx ended before every confirm came.
	timedOut bool
}

func newFlight(c *channel, s *session, n int) *flight {
	return &flight{
		c: c, s: s,
		confirms: make([]*amqp.DeferredConfirmation, n),
		returns:  c.returns,
		returned: map[string]string{},
		closed:   c.closed,
	}
}

// send publishes msgs[idx] in order until the broker blocks the connection, ctx ends, or a
// publish fails: nothing after that is sent.
func (f *flight) send(ctx context.Context, msgs []outbox.Message, idx []int) {
	for j, i := range idx {
		if _, blocked := f.s.isBlocked(); blocked || ctx.Err() != nil {
			return
		}
		dc, err := f.c.ch.PublishWithDeferredConfirm(msgs[i].Exchange, msgs[i].RoutingKey, true, false, publishing(msgs[i]))
		if err != nil {
			return // the channel or the connection is gone: nothing after this was sent
		}
		f.confirms[j] = dc
		f.sent = j + 1
		f.drainReturns() // the library waits only so long for a reader before it drops a return
	}
}

// await waits for the confirm of every message sent, collecting returns as they come, until
// the last confirm, a connection.blocked, or the end of ctx; then it takes the returns left
// and the channel's close reason, if it closed.
//
// RabbitMQ sends a message's basic.return before its ack, and amqp091-go hands both over from
// one goroutine in that order; so once the last ack is in, every return is in c.returns or
// already read.
func (f *flight) await(ctx context.Context) {
	f.waitConfirms(ctx)
	f.drainReturns()
	if f.closedSeen {
		return
	}
	select {
	case e := <-f.closed:
		f.takeClose(e)
	default:
		if f.c.ch.IsClosed() {
			// The channel is closing: its reason follows at once (the library notifies
			// before it settles the pending confirms).
			select {
			case e := <-f.closed:
				f.takeClose(e)
			case <-ctx.Done():
				f.timedOut = true
			}
		}
	}
}

func (f *flight) waitConfirms(ctx context.Context) {
	for _, dc := range f.confirms[:f.sent] {
		for !isDone(dc) {
			select {
			case r, ok := <-f.returns:
				f.takeReturn(r, ok)
			case <-dc.Done():
			case e := <-f.closed:
				// amqp091-go settles every pending confirm as a nack right after.
				f.takeClose(e)
			case <-f.s.changed:
				if _, blocked := f.s.isBlocked(); blocked {
					return
				}
			case <-ctx.Done():
				f.timedOut = true
				return
			}
		}
	}
}

func (f *flight) takeReturn(r amqp.Return, ok bool) {
	if !ok {
		f.returns = nil
		return
	}
	f.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
}

// drainReturns takes the returns already there, without waiting.
func (f *flight) drainReturns() {
	for f.returns != nil {
		select {
		case r, ok := <-f.returns:
			f.takeReturn(r, ok)
		default:
			return
		}
	}
}

func (f *flight) takeClose(e *amqp.Error) {
	f.closeErr, f.closedSeen, f.closed = e, true, nil
}

// observe reads what came of each message, then the state of the channel, ctx, the
// connection and g, in that order: amqp091-go marks a channel closed before it settles the
// confirms still pending as nacks, so a nack read here is the library's whenever the channel
// reads as closed after it.
func (f *flight) observe(ctx context.Context, msgs []outbox.Message, idx []int, g *guard) observation {
	o := observation{answers: make([]answer, len(idx))}
	for j, i := range idx {
		dc, a := f.confirms[j], &o.answers[j]
		switch {
		case j >= f.sent:
			a.confirm = confirmNotSent
		case !isDone(dc):
			a.confirm = confirmPending
		case dc.Acked():
			a.confirm = confirmAck
			if len(f.returned) > 0 {
				a.returned = f.returned[msgs[i].ID.String()]
			}
		default:
			a.confirm = confirmNack
		}
	}
	o.closeErr = f.closeErr
	o.chClosed = f.closedSeen || f.c.ch.IsClosed()
	o.timedOut = f.timedOut
	o.ctxErr = ctx.Err()
	o.connOpen = !f.s.conn.IsClosed() && !g.hasFired()
	o.blockedReason, o.blocked = f.s.isBlocked()
	return o
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

// confirmState is what one message's publisher confirm said by the end of an attempt.
type confirmState uint8

const (
	confirmNotSent confirmState = iota // never published: the attempt stopped before it
	confirmPending                     // published, and no confirm came
	confirmAck
	confirmNack // the broker's nack, or amqp091-go's when the channel closed
)

// answer is what the broker answered about one message of an attempt.
type answer struct {
	confirm confirmState
	// returned is the reply of the basic.return the broker sent for the message ("312
	// NO_ROUTE"); empty if it sent none.
	returned string
}

// observation is everything an attempt saw: what became of each message it was to send, and
// the state of the channel, the connection and the deadline once the wait ended.
type observation struct {
	answers []answer // by position in the attempt
	// closeErr is the reason the channel's close notification gave, when it was read; nil
	// also when amqp091-go closed the channel without one.
	closeErr *amqp.Error
	// chClosed is whether the channel was closed once the answers were read.
	chClosed bool
	// timedOut is whether ctx ended while the attempt waited for confirms.
	timedOut bool
	// ctxErr is ctx.Err() once the answers were read.
	ctxErr error
	// connOpen is whether the connection was open and the guard had not fired.
	connOpen bool
	// blocked is whether the broker blocked the connection, for blockedReason.
	blocked       bool
	blockedReason string
}

// verdicts is what [decide] makes of an attempt.
type verdicts struct {
	// attemptResult's unsettled are positions in the attempt here.
	attemptResult
	// errs holds, by position, the error of each message the broker settled with one
	// (unroutable or nacked); nil when none did.
	errs []error
	// stale is set when the channel must not carry the next batch: confirms or returns may
	// still come for this one's messages. And a nack may come from the channel's own view of
	// a queue: RabbitMQ 3.10 nacks every publish of a channel that first sent to a quorum
	// queue while its leader's node was down, long after another replica took over, while a
	// new channel publishes at once.
	stale bool
}

// decide gives each message of an attempt its verdict from what the attempt observed: acked
// is published, or unroutable if the broker returned it; nacked is refused by the broker;
// anything else is unsettled, and the attempt's result says whom to blame for it.
func decide(o observation) verdicts {
	var (
		v      verdicts
		nacked bool
	)
	set := func(j int, err error) {
		if v.errs == nil {
			v.errs = make([]error, len(o.answers))
		}
		v.errs[j] = err
	}
	for j, a := range o.answers {
		switch {
		case a.confirm == confirmNotSent || a.confirm == confirmPending:
			v.unsettled = append(v.unsettled, j)
		case a.confirm == confirmAck:
			if a.returned != "" {
				set(j, fmt.Errorf("%w: %s", ErrUnroutable, a.returned))
			}
		case o.chClosed:
			// amqp091-go nacks every pending confirm when the channel closes: that is not
			// the broker's verdict on the message. It marks the channel closed before it
			// settles them, so a nack seen with the channel closed may be one of those even
			// when its close was not read (the guard closed the socket at the deadline while
			// the attempt observed: with the socket's writes batched, messages are sent, and
			// wait for a confirm, before the socket blocks). Taken as unsettled: at worst a
			// real nack is published again.
			v.unsettled = append(v.unsettled, j)
		default:
			set(j, errNacked)
			nacked = true
		}
	}
	v.closeErr, v.connOpen = o.closeErr, o.connOpen
	v.timedOut = o.timedOut || o.ctxErr != nil && len(v.unsettled) > 0
	v.stale = len(v.unsettled) > 0 || nacked
	if len(v.unsettled) > 0 {
		v.unavailable = blame(o, v.timedOut)
	}
	return v
}

// blame is the error of an attempt's unsettled messages when the broker or the connection is
// to blame for them; nil when a message is: the broker closed the channel with a soft error
// on a connection still open (see [attemptResult.isolate]).
func blame(o observation, timedOut bool) error {
	switch {
	case o.blocked:
		return fmt.Errorf("%w: the broker blocked the connection: %s", outbox.ErrUnavailable, o.blockedReason)
	case timedOut:
		return fmt.Errorf("%w: no confirm within the deadline: %v", outbox.ErrUnavailable, o.ctxErr)
	case !o.connOpen:
		return fmt.Errorf("%w: connection closed: %v", outbox.ErrUnavailable, o.closeErr)
	case o.closeErr == nil || !o.closeErr.Server || !o.closeErr.Recover:
		// Closed by the client library, or a hard error on a connection still open
		// (neither should happen; be safe).
		return fmt.Errorf("%w: channel closed: %v", outbox.ErrUnavailable, o.closeErr)
	}
	return nil
}

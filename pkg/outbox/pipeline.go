package outbox

import (
	"context"
	"fmt"
	"time"
)

// pipeline keeps up to limit batches of one relay in flight. Run's goroutine claims the
// batches, one after the other; each claimed batch then goes on on a goroutine of its own:
// it waits until the batch claimed before it was sent, is published, and is marked and
// committed as soon as its confirms are in. See README.md#batches-in-flight for what that
// guarantees.
//
// Only Run's goroutine uses a pipeline.
type pipeline struct {
	r     *Relay
	limit int
	// queue holds the batches in flight, in the order they were claimed.
	queue []*inflight
}

// inflight is a batch on its goroutine, and how it ended.
type inflight struct {
	b    *batch
	done chan struct{}
	res  cycleResult
	err  error
	// panicked is what a hook of the batch panicked with (hasPanic: it did).
	panicked any
	hasPanic bool
}

// step claims the next batch and sends it on its way; it reports the batches that ended
// meanwhile, for Run's pacing. With a limit of 1 it is the serial cycle. Otherwise it
// returns with the batch still in flight when the claim was full (more rows are likely
// waiting), after first making room by waiting for the oldest batch when every slot is
// taken; when the claim was not full, or a batch that ended failed (an outage) or sent
// nothing, it waits for every batch in flight before it returns, so that Run never pauses
// with a claim held.
func (p *pipeline) step(ctx context.Context) (res cycleResult, err error) {
	if p.limit == 1 {
		return p.r.cycle(ctx)
	}
	for len(p.queue) >= p.limit {
		f := p.oldest()
		res.add(f.res)
		if f.err != nil || f.res.claimed > 0 && f.res.settled == 0 {
			return res, p.wait(&res, f.err)
		}
	}
	b, err := p.r.claimNext(ctx)
	if err != nil {
		return res, p.wait(&res, err)
	}
	if b == nil {
		return res, p.wait(&res, nil)
	}
	res.last = len(b.msgs)
	p.start(b)
	if res.last == p.r.cfg.BatchSize {
		res.more = true
		return res, nil
	}
	return res, p.wait(&res, nil)
}

// start sends b on its way, after the batch claimed before it.
func (p *pipeline) start(b *batch) {
	var prev *batch
	if n := len(p.queue); n > 0 {
		prev = p.queue[n-1].b
	}
	f := &inflight{b: b, done: make(chan struct{})}
	p.queue = append(p.queue, f)
	go func() {
		defer close(f.done)
		defer func() {
			if v := recover(); v != nil {
				f.panicked, f.hasPanic = v, true
			}
		}()
		f.res, f.err = p.r.finish(b, prev)
	}()
}

// oldest waits for the oldest batch in flight to end and takes it out of the queue. If a
// hook of that batch panicked, it lets the other batches end and panics with the same value
// on Run's goroutine.
func (p *pipeline) oldest() *inflight {
	f := p.queue[0]
	<-f.done
	p.queue = p.queue[1:]
	if f.hasPanic {
		p.abandon()
		panic(f.panicked)
	}
	return f
}

// wait waits for every batch in flight, adds their results to res, and returns first, or
// else the first error of theirs.
func (p *pipeline) wait(res *cycleResult, first error) error {
	for len(p.queue) > 0 {
		f := p.oldest()
		res.add(f.res)
		if first == nil {
			first = f.err
		}
	}
	return first
}

// drain waits for every batch in flight.
func (p *pipeline) drain() {
	var res cycleResult
	_ = p.wait(&res, nil)
}

// abandon waits for every batch in flight, whatever their hooks did: for a Run that is
// unwinding. Each batch ends within its own bounds (PublishTimeout and ClaimTimeout).
func (p *pipeline) abandon() {
	for _, f := range p.queue {
		<-f.done
	}
	p.queue = nil
}

// waitForPrevious decides whether b, claimed after prev, is sent. With a Publisher that
// sends one batch at a time, it waits until prev was sent, so that a relay sends its batches
// in the order it claimed them; with a [ConcurrentPublisher] it does not wait: b goes out
// while prev's confirms are still coming (the claim's head rule keeps every aggregate in
// order, whatever order the batches are sent and confirmed in). Either way, b is not sent if
// prev found the broker unavailable before b's turn came, so that a relay stops sending as
// soon as it knows of an outage. It returns nil when b may be sent, else the error (wrapping
// [ErrUnavailable]: the broker's, never the messages' fault) that b's rows are left
// untouched with. The wait counts against b's PublishTimeout.
func (r *Relay) waitForPrevious(b, prev *batch) error {
	if prev == nil {
		return nil
	}
	if r.concurrentSends {
		select {
		case <-prev.sent:
		default:
			return nil // prev is being sent: b goes out beside it
		}
	} else {
		t := time.NewTimer(time.Until(b.publishBy))
		defer t.Stop()
		select {
		case <-prev.sent:
		case <-t.C:
			return fmt.Errorf("%w: not sent: the publish deadline passed while the batch before it was being sent", ErrUnavailable)
		}
	}
	if prev.brokerDown != nil {
		return fmt.Errorf("not sent: the batch before it found the broker unavailable: %w", prev.brokerDown)
	}
	return nil
}

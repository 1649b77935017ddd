package inboxrabbitmq

import (
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// ackDelay bounds how long an acknowledgement waits to be sent with others: it keeps the
// deliveries the broker counts against the prefetch close to those in hand, and a crash's
// redeliveries (absorbed by the inbox) few.
const ackDelay = 5 * time.Millisecond

// errAckerClosed is returned by a nack after the channel closed: the broker redelivers the
// delivery by itself.
var errAckerClosed = errors.New("the channel is closed")

// ackChannel is what the acker needs of an *amqp.Channel.
type ackChannel interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// acker settles one channel's deliveries with the broker. Processed deliveries are
// acknowledged together, with one ack with the multiple flag, up to the watermark: the
// highest delivery tag below which every delivery is settled. Workers finish out of order,
// and a multiple ack settles every unacknowledged delivery up to its tag, so it is never
// sent past a delivery still in hand. The acker knows every delivery before a worker does
// (received, called in tag order as they arrive), so a delivery it does not know of has a
// higher tag than any it acknowledges.
//
// Pending acknowledgements go out as one multiple ack once every of them wait below the
// first delivery in hand, and all of them at most ackDelay after the first: those below the
// watermark with one multiple ack, those above it (behind a delivery held or slow) one by
// one. Negative acknowledgements, and the acks of retried, dead-lettered and handed-back
// deliveries, go out at once, one by one. With every 1, each ack goes out at once, alone.
//
// An acknowledgement is only ever sent after what it acknowledges is committed or confirmed;
// one that is pending when the channel closes or the process dies is never sent, and the
// broker redelivers its message, which the inbox absorbs as a duplicate. After close
// nothing is sent: a delivery tag means nothing on another channel.
type acker struct {
	ch    ackChannel
	every int
	log   *slog.Logger

	mu sync.Mutex
	// window holds the deliveries received and not yet acknowledged to the broker, in tag
	// order; pending counts those of them processed, whose ack waits.
	window  []ackSlot
	pending int
	timer   *time.Timer
	closed  bool
	// warned is set once a failed ack was logged, so that a channel gone mid-flush says so
	// once.
	warned bool
}

// ackSlot is a delivery in the acker's window.
type ackSlot struct {
	tag   uint64
	state ackState
}

type ackState uint8

const (
	inHand     ackState = iota // not settled yet
	ackPending                 // processed; its ack waits to go out with others
	settled                    // acknowledged or rejected on its own
)

func newAcker(ch ackChannel, every int, log *slog.Logger) *acker {
	return &acker{ch: ch, every: max(1, every), log: log}
}

// received records a delivery, before any worker may settle it.
func (a *acker) received(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.window = append(a.window, ackSlot{tag: tag})
}

// ack acknowledges processed deliveries: with every 1 at once, one by one; otherwise with
// others, as the acker's doc says.
func (a *acker) ack(tags ...uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	for _, tag := range tags {
		if a.every == 1 {
			a.sendLocked(tag, false)
			a.markLocked(tag, settled)
			continue
		}
		if a.markLocked(tag, ackPending) {
			a.pending++
		}
	}
	a.flushLocked(false)
}

// ackNow acknowledges one delivery at once, alone: the original of a copy the broker
// confirmed (a retry, a dead letter, a hand-back). It returns the channel's error.
func (a *acker) ackNow(tag uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errAckerClosed
	}
	err := a.ch.Ack(tag, false)
	a.markLocked(tag, settled)
	a.flushLocked(false)
	return err
}

// nack rejects one delivery at once, with requeue, for the broker to deliver again. It
// returns the channel's error.
func (a *acker) nack(tag uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errAckerClosed
	}
	err := a.ch.Nack(tag, false, true)
	a.markLocked(tag, settled)
	a.flushLocked(false)
	return err
}

// flush sends every pending acknowledgement now: before the channel closes on a stop.
func (a *acker) flush() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.flushLocked(true)
	}
}

// close ends the acker with its channel: pending acknowledgements are dropped, and nothing
// is sent any more.
func (a *acker) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.timer != nil {
		a.timer.Stop()
	}
}

// markLocked sets the state of the delivery tag, and reports whether it was in hand.
func (a *acker) markLocked(tag uint64, state ackState) bool {
	i := sort.Search(len(a.window), func(i int) bool { return a.window[i].tag >= tag })
	if i == len(a.window) || a.window[i].tag != tag || a.window[i].state != inHand {
		return false // unknown (acknowledged already): nothing to change
	}
	a.window[i].state = state
	return true
}

// flushLocked sends the pending acknowledgements that are due: below the watermark with one
// multiple ack when every of them wait there, or all of them when force. It trims the
// window's settled front and arms the timer for what still waits.
func (a *acker) flushLocked(force bool) {
	// The watermark: the prefix of the window without a delivery in hand.
	last, below := -1, 0
	for i, s := range a.window {
		if s.state == inHand {
			break
		}
		if s.state == ackPending {
			last, below = i, below+1
		}
	}
	if last >= 0 && (force || below >= a.every) {
		a.sendLocked(a.window[last].tag, true)
		a.window = a.window[last+1:]
		a.pending -= below
	}
	if force && a.pending > 0 {
		for i := range a.window {
			if a.window[i].state == ackPending {
				a.sendLocked(a.window[i].tag, false)
				a.window[i].state = settled
			}
		}
		a.pending = 0
	}
	for len(a.window) > 0 && a.window[0].state == settled {
		a.window = a.window[1:]
	}
	if a.pending > 0 && a.timer == nil {
		a.timer = time.AfterFunc(ackDelay, a.onTimer)
	}
}

// onTimer flushes what waited ackDelay.
func (a *acker) onTimer() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.timer = nil
	if !a.closed {
		a.flushLocked(true)
	}
}

// sendLocked sends one ack. A failed ack means the channel is closing: the broker redelivers
// what it did not acknowledge, and the inbox absorbs it.
func (a *acker) sendLocked(tag uint64, multiple bool) {
	if err := a.ch.Ack(tag, multiple); err != nil && !a.warned {
		a.warned = true
		a.log.Warn("ack failed; the broker will redeliver what it did not acknowledge, and the inbox will skip it",
			slog.Uint64("delivery_tag", tag), slog.Bool("multiple", multiple), slog.Any("error", err))
	}
}

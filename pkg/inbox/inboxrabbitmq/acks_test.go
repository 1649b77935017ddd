package inboxrabbitmq

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// brokerChannel models what a RabbitMQ channel does with acknowledgements: it keeps the
// delivery tags it handed out and not yet settled, and refuses a tag it does not hold (the
// broker closes the channel with PRECONDITION_FAILED, unknown delivery tag). A multiple ack
// settles every outstanding tag up to its own. It records every frame, and fails the test
// when a delivery is settled before the consumer was done with it.
type brokerChannel struct {
	t           *testing.T
	mu          sync.Mutex
	outstanding map[uint64]bool
	done        map[uint64]bool // processed or given up by the consumer: may be settled
	acked       map[uint64]bool
	nacked      map[uint64]bool
	frames      []string
	closed      bool
}

func newBrokerChannel(t *testing.T) *brokerChannel {
	return &brokerChannel{t: t, outstanding: map[uint64]bool{}, done: map[uint64]bool{},
		acked: map[uint64]bool{}, nacked: map[uint64]bool{}}
}

func (b *brokerChannel) deliver(tag uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outstanding[tag] = true
}

// finish records that the consumer is done with tag (committed, or its copy confirmed).
func (b *brokerChannel) finish(tag uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done[tag] = true
}

func (b *brokerChannel) Ack(tag uint64, multiple bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames = append(b.frames, fmt.Sprintf("ack %d multiple=%t", tag, multiple))
	if b.closed {
		b.t.Errorf("ack %d after the channel closed", tag)
		return io.EOF
	}
	if !b.outstanding[tag] {
		b.t.Errorf("ack of unknown delivery tag %d (multiple=%t)", tag, multiple)
		return io.EOF
	}
	for t := range b.outstanding {
		if t == tag || (multiple && t < tag) {
			if !b.done[t] {
				b.t.Errorf("delivery %d acknowledged before the consumer was done with it (ack %d multiple=%t)", t, tag, multiple)
			}
			delete(b.outstanding, t)
			b.acked[t] = true
		}
	}
	return nil
}

func (b *brokerChannel) Nack(tag uint64, multiple, requeue bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames = append(b.frames, fmt.Sprintf("nack %d", tag))
	if multiple || !requeue || !b.outstanding[tag] {
		b.t.Errorf("unexpected nack %d multiple=%t requeue=%t outstanding=%t", tag, multiple, requeue, b.outstanding[tag])
		return io.EOF
	}
	delete(b.outstanding, tag)
	b.nacked[tag] = true
	return nil
}

func (b *brokerChannel) state() (outstanding, acked, nacked, frames int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.outstanding), len(b.acked), len(b.nacked), len(b.frames)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestAcker(t *testing.T) {
	t.Parallel()

	// deliverAll hands out tags 1..n to the model and the acker, in order.
	deliverAll := func(b *brokerChannel, a *acker, n int) {
		for tag := uint64(1); tag <= uint64(n); tag++ {
			b.deliver(tag)
			a.received(tag)
		}
	}

	t.Run("InOrderAcksGoOutAsOneMultipleAckPerEvery", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 8, discardLogger())
		defer a.close()
		deliverAll(b, a, 32)
		for tag := uint64(1); tag <= 32; tag++ {
			b.finish(tag)
			a.ack(tag)
		}
		outstanding, acked, _, frames := b.state()
		require.Equal(t, 0, outstanding)
		require.Equal(t, 32, acked)
		require.Equal(t, 4, frames, "one multiple ack per 8: %v", b.frames)
	})

	t.Run("EveryOneAcksEachAtOnce", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 1, discardLogger())
		defer a.close()
		deliverAll(b, a, 5)
		for _, tag := range []uint64{3, 1, 5, 2, 4} {
			b.finish(tag)
			a.ack(tag)
			b.mu.Lock()
			require.True(t, b.acked[tag], "ack %d not sent at once", tag)
			b.mu.Unlock()
		}
		require.Equal(t, []string{"ack 3 multiple=false", "ack 1 multiple=false", "ack 5 multiple=false",
			"ack 2 multiple=false", "ack 4 multiple=false"}, b.frames)
	})

	t.Run("NeverPastADeliveryInHand", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 2, discardLogger())
		defer a.close()
		deliverAll(b, a, 10)
		// 1 is in hand (held): 2..10 are processed. Nothing may cover 1, and the acks behind
		// it go out one by one once the timer fires.
		for tag := uint64(2); tag <= 10; tag++ {
			b.finish(tag)
			a.ack(tag)
		}
		require.Eventually(t, func() bool { _, acked, _, _ := b.state(); return acked == 9 }, 5*time.Second, time.Millisecond)
		require.False(t, b.acked[1])
		b.finish(1)
		a.ack(1)
		require.Eventually(t, func() bool { outstanding, _, _, _ := b.state(); return outstanding == 0 }, 5*time.Second, time.Millisecond)
	})

	t.Run("NacksGoOutAtOnceAndCountAsSettled", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 4, discardLogger())
		defer a.close()
		deliverAll(b, a, 4)
		require.NoError(t, a.nack(1))
		require.True(t, b.nacked[1])
		for tag := uint64(2); tag <= 4; tag++ {
			b.finish(tag)
		}
		a.ack(2, 3)
		require.NoError(t, a.ackNow(4)) // a retried original: at once, alone
		// 2 and 3 wait for the timer (below every), and go out as one multiple ack.
		require.Eventually(t, func() bool { outstanding, _, _, _ := b.state(); return outstanding == 0 }, 5*time.Second, time.Millisecond)
		require.Equal(t, []string{"nack 1", "ack 4 multiple=false", "ack 3 multiple=true"}, b.frames)
	})

	t.Run("FlushSendsEverythingPending", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 16, discardLogger())
		defer a.close()
		deliverAll(b, a, 6)
		for _, tag := range []uint64{1, 2, 4, 6} {
			b.finish(tag)
			a.ack(tag)
		}
		a.flush()
		outstanding, acked, _, _ := b.state()
		require.Equal(t, 2, outstanding) // 3 and 5, in hand
		require.Equal(t, 4, acked)
		require.Equal(t, []string{"ack 2 multiple=true", "ack 4 multiple=false", "ack 6 multiple=false"}, b.frames)
	})

	t.Run("NothingAfterClose", func(t *testing.T) {
		t.Parallel()
		b := newBrokerChannel(t)
		a := newAcker(b, 4, discardLogger())
		deliverAll(b, a, 4)
		b.finish(1)
		a.ack(1) // pending: below every
		a.close()
		b.mu.Lock()
		b.closed = true // a frame now fails the test
		b.mu.Unlock()
		a.ack(2)
		a.flush()
		require.ErrorIs(t, a.nack(3), errAckerClosed)
		require.ErrorIs(t, a.ackNow(4), errAckerClosed)
		time.Sleep(3 * ackDelay) // the timer armed by the first ack must not fire a frame
		require.Empty(t, b.frames)
	})

	// Random completion orders, concurrent workers, acks, immediate acks and nacks: the
	// model fails the test on any delivery settled before it was done, and on any tag sent
	// twice; in the end everything is settled.
	t.Run("RandomOrders", func(t *testing.T) {
		t.Parallel()
		for seed := range uint64(50) {
			b := newBrokerChannel(t)
			every := 1 + int(seed%16)
			a := newAcker(b, every, discardLogger())
			const n = 200
			r := rand.New(rand.NewPCG(seed, 1))
			tags := make(chan uint64, n)
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for tag := range tags {
						b.finish(tag)
						switch tag % 10 {
						case 0:
							_ = a.nack(tag)
						case 1:
							_ = a.ackNow(tag)
						default:
							a.ack(tag)
						}
					}
				})
			}
			order := r.Perm(n)
			for tag := uint64(1); tag <= n; tag++ {
				b.deliver(tag)
				a.received(tag)
			}
			for _, i := range order {
				tags <- uint64(i + 1)
			}
			close(tags)
			wg.Wait()
			a.flush()
			a.close()
			outstanding, acked, nacked, frames := b.state()
			require.Zero(t, outstanding, "seed %d", seed)
			require.Equal(t, n, acked+nacked, "seed %d", seed)
			t.Logf("seed %d every %d: %d frames for %d deliveries", seed, every, frames, n)
		}
	})
}

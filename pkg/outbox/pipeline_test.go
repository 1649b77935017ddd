package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// inFlightCases are the relays that tests of the relay's guarantees run against: the
// default, pipelined one, which sends its batches at once on as many publisher connections,
// and the serial one. conns is the connections of the RabbitMQ publisher it is given.
var inFlightCases = []struct {
	name     string
	inFlight int
	conns    int
}{{"Pipelined", 0, outbox.DefaultInFlightBatches}, {"Serial", 1, 1}}

// TestPipeline holds the pipelined relay (several batches in flight) to the guarantees of
// the serial one.
func TestPipeline(t *testing.T) {
	t.Parallel()

	t.Run("ThreeRelaysTwoBatchesEachKeepAggregateOrder", func(t *testing.T) {
		// 10,000 rows of 50 aggregates, three relays with two batches in flight each, sent
		// at once on two connections, on the real broker: the consumer sees each
		// aggregate's rows in write order (by the sequence number in the body), and each
		// relay did keep two batches in flight.
		t.Parallel()
		ctx := context.Background()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		const aggregates, perAggregate = 50, 200
		// Most rows are written before the relays start, the rest while they run: a backlog
		// makes full claims, and so overlapping batches.
		writeRows := func(from, to int) {
			for n := from; n < to; n += 10 {
				require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					msgs := make([]outbox.Message, 0, 10*aggregates)
					for i := n; i < min(n+10, to); i++ {
						for a := range aggregates {
							msgs = append(msgs, b.msg(fmt.Sprintf("agg-%02d", a), i))
						}
					}
					return outbox.Add(ctx, tx, msgs...)
				}))
			}
		}
		writeRows(0, perAggregate*3/4)

		var maxInFlight [3]atomic.Int32
		for i := range 3 {
			var inFlight atomic.Int32
			cfg := fastConfig(t)
			cfg.InFlightBatches = 2
			// Fewer rows per batch than aggregates: claims are full while the backlog lasts.
			cfg.BatchSize = 8
			cfg.Hooks.Polled = func(p outbox.Poll) {
				if p.Claimed > 0 {
					n := inFlight.Add(1)
					if n > maxInFlight[i].Load() {
						maxInFlight[i].Store(n)
					}
				}
			}
			cfg.Hooks.BatchDone = func(outbox.BatchResult) { inFlight.Add(-1) }
			// Two connections: each batch goes out as soon as it is claimed, beside the one
			// before it.
			b.startRelay(t, b.pool, newPublisherConns(t, b.amqpURL, 2), cfg)
		}
		writeRows(perAggregate*3/4, perAggregate)

		total := aggregates * perAggregate
		testinfra.Eventually(t, 6*waitFor, func() bool { return len(got.ids()) == total }, "all %d rows delivered", total)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == total }, "all rows marked")
		require.Zero(t, b.count(t, "attempts > 0"))

		next := map[string]int{}
		seen := map[string]bool{}
		for _, d := range got.all() {
			if seen[d.MessageId] {
				continue // a duplicate may trail; the inbox drops it
			}
			seen[d.MessageId] = true
			var body struct {
				Aggregate string
				N         int
			}
			require.NoError(t, json.Unmarshal(d.Body, &body))
			require.Equal(t, next[body.Aggregate], body.N, "aggregate %s out of order", body.Aggregate)
			next[body.Aggregate]++
		}
		require.Len(t, next, aggregates)
		for i := range maxInFlight {
			require.Equal(t, int32(2), maxInFlight[i].Load(), "relay %d kept two batches in flight", i)
		}
	})

	t.Run("ConcurrentPublisherSendsBesideTheBatchBefore", func(t *testing.T) {
		// The first batch's publish is held until a second one starts: with a
		// ConcurrentPublisher the relay sends its next batch while the one before waits for
		// its confirms.
		t.Parallel()
		b := setup(t)
		for i := range 4 {
			b.write(t, b.msg(fmt.Sprintf("agg-%d", i), 0))
		}
		pub := &overlapPublisher{ConcurrentPublisher: newPublisherConns(t, b.amqpURL, 2), second: make(chan struct{})}
		cfg := fastConfig(t)
		cfg.InFlightBatches = 2
		cfg.BatchSize = 2
		b.startRelay(t, b.pool, pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 4 }, "all rows published")
		require.EqualValues(t, 2, pub.most.Load(), "two publishes at once")
		require.Zero(t, b.count(t, "attempts > 0"))
	})

	t.Run("SerialPublisherOneBatchAtATime", func(t *testing.T) {
		// The same with a Publisher that is not a ConcurrentPublisher: the relay never
		// calls it twice at once, though it has two batches in flight.
		t.Parallel()
		b := setup(t)
		for i := range 40 {
			b.write(t, b.msg(fmt.Sprintf("agg-%d", i), 0))
		}
		pub := &overlapPublisher{ConcurrentPublisher: newPublisherConns(t, b.amqpURL, 2), serial: true}
		cfg := fastConfig(t)
		cfg.InFlightBatches = 2
		cfg.BatchSize = 2
		b.startRelay(t, b.pool, serialOnly{pub}, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 40 }, "all rows published")
		require.EqualValues(t, 1, pub.most.Load(), "one publish at a time")
	})
}

// overlapPublisher counts the Publish calls under way at once. Unless serial, the first call
// waits for a second one to start (for 10 s at most) before it publishes.
type overlapPublisher struct {
	outbox.ConcurrentPublisher
	serial     bool
	second     chan struct{}
	now, most  atomic.Int32
	calls      atomic.Int32
	secondOnce sync.Once
}

func (p *overlapPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	n := p.now.Add(1)
	defer p.now.Add(-1)
	for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
	}
	if !p.serial {
		if p.calls.Add(1) == 1 {
			select {
			case <-p.second:
			case <-time.After(10 * time.Second):
			}
		} else {
			p.secondOnce.Do(func() { close(p.second) })
		}
	}
	return p.ConcurrentPublisher.Publish(ctx, msgs)
}

// serialOnly hides ConcurrentPublishes: the relay sees a plain Publisher.
type serialOnly struct{ p outbox.Publisher }

func (s serialOnly) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return s.p.Publish(ctx, msgs)
}

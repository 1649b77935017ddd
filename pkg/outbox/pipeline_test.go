package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// inFlightCases are the relays that tests of the relay's guarantees run against: the
// default, pipelined one, and the serial one.
var inFlightCases = []struct {
	name     string
	inFlight int
}{{"Pipelined", 0}, {"Serial", 1}}

// TestPipeline holds the pipelined relay (several batches in flight) to the guarantees of
// the serial one.
func TestPipeline(t *testing.T) {
	t.Parallel()

	t.Run("ThreeRelaysTwoBatchesEachKeepAggregateOrder", func(t *testing.T) {
		// 10,000 rows of 50 aggregates, three relays with two batches in flight each, on the
		// real broker: the consumer sees each aggregate's rows in write order (by the
		// sequence number in the body), and each relay did keep two batches in flight.
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
			b.startRelay(t, b.pool, newPublisher(t, b.amqpURL), cfg)
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
}

package outbox_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestRelayBrokerStopsReading(t *testing.T) {
	// A broker that stops reading (a resource alarm without connection.blocked, a
	// black-holed network) leaves amqp091-go's socket write blocked for ever. The cycle must
	// still end within PublishTimeout + 1s, report the broker unavailable, publish nothing it
	// was not confirmed, and publish everything once the broker reads again.
	t.Parallel()
	for _, c := range inFlightCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			u, err := amqp.ParseURI(b.amqpURL)
			require.NoError(t, err)
			proxy := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", u.Host, u.Port))
			pub := newPublisherConns(t, proxy.RewriteURL(t, b.amqpURL), c.conns)

			var (
				mu          sync.Mutex
				claimed     time.Time // when the relay last claimed rows
				unavailable time.Time
			)
			cfg := fastConfig(t)
			cfg.PublishTimeout = time.Second
			cfg.InFlightBatches = c.inFlight
			cfg.Hooks.Polled = func(p outbox.Poll) {
				mu.Lock()
				defer mu.Unlock()
				if p.Claimed > 0 && unavailable.IsZero() {
					claimed = time.Now()
				}
			}
			cfg.Hooks.StateChanged = func(c outbox.StateChange) {
				mu.Lock()
				defer mu.Unlock()
				if c.To == outbox.StateBrokerUnavailable && unavailable.IsZero() {
					unavailable = time.Now()
				}
			}
			b.write(t, b.msg("warm-up", 0))
			r := b.startRelay(t, b.pool, pub, cfg)
			testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 1 }, "warm-up published")

			proxy.Freeze()
			// More than the socket buffers hold, so that the writes block.
			msgs := make([]outbox.Message, 8)
			for i := range msgs {
				msgs[i] = b.msg(fmt.Sprintf("big-%d", i), i)
				msgs[i].Payload = json.RawMessage(`{"p": "` + strings.Repeat("x", 1<<20) + `"}`)
			}
			b.write(t, msgs...)
			testinfra.Eventually(t, waitFor, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return !unavailable.IsZero()
			}, "the relay reports the broker unavailable")
			mu.Lock()
			took := unavailable.Sub(claimed)
			mu.Unlock()
			require.Less(t, took, cfg.PublishTimeout+time.Second, "the cycle ends within PublishTimeout + 1s")
			t.Logf("broker unavailable %s after the rows were claimed", took)
			require.Zero(t, b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'big-%'"), "nothing unconfirmed is marked published")
			require.Zero(t, b.count(t, "attempts > 0"), "an outage costs no attempts")

			proxy.Resume()
			testinfra.Eventually(t, waitFor, func() bool {
				return b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'big-%'") == len(msgs)
			}, "everything published once the broker reads again")
			testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateRunning }, "running again")
		})
	}
}

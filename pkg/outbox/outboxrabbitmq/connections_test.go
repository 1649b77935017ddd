package outboxrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestPublisherConnections holds Config.Connections to its word: that many batches are sent
// at once, each on a connection of its own, and one connection's trouble is its own batch's.
func TestPublisherConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	batch := func(exchange string, n int) []outbox.Message {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = message(exchange)
		}
		return msgs
	}
	// heldSetup is a Setup whose first call waits until release is closed; entered is
	// closed when it starts waiting.
	heldSetup := func() (setup func(*amqp.Channel) error, entered, release chan struct{}) {
		entered, release = make(chan struct{}), make(chan struct{})
		var once sync.Once
		return func(*amqp.Channel) error {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release
			}
			return nil
		}, entered, release
	}

	t.Run("ASecondBatchGoesOutBesideAHeldOne", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		setup, entered, release := heldSetup()
		var (
			mu      sync.Mutex
			changes []outboxrabbitmq.ConnectionChange
		)
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url, Connections: 2, Setup: setup, Hooks: outboxrabbitmq.Hooks{
			Connected: func(c outboxrabbitmq.ConnectionChange) { mu.Lock(); changes = append(changes, c); mu.Unlock() },
		}})
		require.NoError(t, err)
		require.Equal(t, 2, pub.ConcurrentPublishes())
		var _ outbox.ConcurrentPublisher = pub

		held := make(chan []error, 1)
		go func() { held <- pub.Publish(ctx, batch(top.Exchange, 3)) }()
		<-entered // the first batch holds one connection, in Setup
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for i, err := range pub.Publish(dctx, batch(top.Exchange, 5)) {
			require.NoError(t, err, "message %d of the batch sent beside the held one", i)
		}
		select {
		case errs := <-held:
			t.Fatalf("the held batch returned %v before its Setup did", errs)
		default:
		}
		close(release)
		for i, err := range <-held {
			require.NoError(t, err, "message %d of the held batch", i)
		}
		require.Equal(t, 8, queueDepth(t, url, top.Queue))

		require.NoError(t, pub.Close())
		mu.Lock()
		defer mu.Unlock()
		var conns, opens []int
		for _, c := range changes {
			conns = append(conns, c.Connection)
			opens = append(opens, c.Open)
		}
		slices.Sort(conns)
		require.Equal(t, []int{0, 0, 1, 1}, conns, "each connection came up and was closed: %+v", changes)
		require.Equal(t, []int{1, 2, 1, 0}, opens, "Open counts the connections open after each change")
	})

	t.Run("OneConnectionSendsOneBatchAtATime", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		setup, entered, release := heldSetup()
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url, Setup: setup})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		require.Equal(t, 1, pub.ConcurrentPublishes())

		held := make(chan []error, 1)
		go func() { held <- pub.Publish(ctx, batch(top.Exchange, 3)) }()
		<-entered
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		for _, err := range pub.Publish(dctx, batch(top.Exchange, 5)) {
			require.ErrorIs(t, err, outbox.ErrNotSent, "the deadline passed while the only connection was taken")
		}
		close(release)
		for _, err := range <-held {
			require.NoError(t, err)
		}
		require.Equal(t, 3, queueDepth(t, url, top.Queue), "the batch that waited sent nothing")
	})

	t.Run("AHungConnectionCostsOnlyItsOwnBatch", func(t *testing.T) {
		// Two batches connect at once, each on its own connection through its own proxy;
		// once both are up (both in Setup), one proxy stops passing the broker's bytes. The batch on it gets
		// outbox.ErrUnavailable at its deadline, the other is confirmed, and afterwards both
		// connections publish again.
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		uri, err := amqp.ParseURI(url)
		require.NoError(t, err)
		proxies := map[string]*testinfra.Proxy{}
		var urls []string
		for range 2 {
			p := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", uri.Host, uri.Port))
			proxies[p.Addr()] = p
			urls = append(urls, p.RewriteURL(t, url))
		}
		var (
			mu      sync.Mutex
			up      []string
			entered int
			bothIn  = make(chan struct{})
			stalled *testinfra.Proxy
		)
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URLs: urls, Connections: 2,
			Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
				if c.Up {
					mu.Lock()
					up = append(up, c.Broker)
					mu.Unlock()
				}
			}},
			// Each connection's first channel waits here until both connections are up.
			Setup: func(*amqp.Channel) error {
				mu.Lock()
				entered++
				if entered == 2 {
					stalled = proxies[up[0]]
					stalled.Stall()
					close(bothIn)
				}
				mu.Unlock()
				select {
				case <-bothIn:
				case <-time.After(20 * time.Second):
				}
				return nil
			},
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })

		results := make(chan []error, 2)
		for range 2 {
			go func() {
				dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				results <- pub.Publish(dctx, batch(top.Exchange, 4))
			}()
		}
		var outcomes []string
		for range 2 {
			errs := <-results
			switch {
			case !slices.ContainsFunc(errs, func(err error) bool { return err != nil }):
				outcomes = append(outcomes, "confirmed")
			case !slices.ContainsFunc(errs, func(err error) bool { return !errors.Is(err, outbox.ErrUnavailable) }):
				outcomes = append(outcomes, "unavailable")
			default:
				t.Fatalf("a batch with mixed outcomes: %v", errs)
			}
		}
		slices.Sort(outcomes)
		require.Equal(t, []string{"confirmed", "unavailable"}, outcomes)
		require.NotEqual(t, up[0], up[1], "the two connections went to different nodes (round-robin)")

		stalled.Resume()
		for range 2 {
			require.NoError(t, pub.Publish(ctx, batch(top.Exchange, 1))[0], "the publisher publishes again on both connections")
		}
	})

	t.Run("InvalidConnections", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{-1, outboxrabbitmq.MaxConnections + 1} {
			_, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: "amqp://localhost", Connections: n})
			require.ErrorContains(t, err, "connections must be between 0 (default 1) and 16")
		}
	})
}

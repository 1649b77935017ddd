package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

const waitFor = 20 * time.Second

func TestRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PublishesCommittedRowsWithTheirProperties", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		m := b.msg("order-1", 1)
		m.Headers = map[string]string{outbox.HeaderCorrelationID: "corr-1", outbox.HeaderCausationID: "cause-1"}
		m = b.write(t, m)[0]
		b.startRelay(t, b.pool, b.pub, fastConfig(t))

		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "message delivered")
		d := got.all()[0]
		require.Equal(t, m.ID.String(), d.MessageId)
		require.Equal(t, "TestEvent", d.Type)
		require.Equal(t, "application/json", d.ContentType)
		require.Equal(t, amqp.Persistent, d.DeliveryMode)
		require.Equal(t, "corr-1", d.CorrelationId)
		require.Equal(t, "cause-1", d.Headers[outbox.HeaderCausationID])
		require.Equal(t, "order-1", d.Headers["aggregate_id"])
		require.JSONEq(t, string(m.Payload), string(d.Body))
		require.False(t, d.Timestamp.IsZero())
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 1 }, "row marked published")
	})

	t.Run("WakesOnNotifyNotOnPoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.PollInterval = time.Hour // only a notification can wake it
		r := b.startRelay(t, b.pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateRunning }, "relay running")
		// The first write may race the LISTEN; the relay polls once after LISTEN succeeds,
		// so by the second write it is listening for sure.
		b.write(t, b.msg("a", 1))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "first message delivered")
		b.write(t, b.msg("a", 2))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 2 }, "second message delivered by notification")
	})

	t.Run("OneNotifierAtATime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		listener := b.conn(t)
		_, err := listener.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
		require.NoError(t, err)

		// A transaction of many rows notifies once.
		many := make([]outbox.Message, 50)
		for i := range many {
			many[i] = b.msg("many", i)
		}
		b.write(t, many...)
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.NotifyChannel, n.Channel)

		// While another transaction holds the notifier's lock (it is committing its own
		// notification), a writer commits without notifying; the next writer notifies.
		skipper, notifier := b.conn(t), b.conn(t)
		holdNotifierLock(t, b, func() { writeOn(t, b, skipper, b.msg("skip", 1)) })
		writeOn(t, b, notifier, b.msg("notify", 1))
		n, err = listener.WaitForNotification(ctx)
		require.NoError(t, err)
		require.Equal(t, notifier.PgConn().PID(), n.PID, "the skipping writer notified; or the batch of 50 notified twice")
	})

	t.Run("RecheckPublishesRowsOfWritersThatSkippedNotify", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		skipper := b.conn(t)
		var armed atomic.Bool
		cfg := fastConfig(t)
		cfg.PollInterval = time.Hour // only notifications and re-checks can wake it
		// The race, made certain: a writer commits without notifying (another transaction
		// holds the notifier's lock) after the notified cycle claimed, before it published.
		cfg.Hooks.Failpoint = func(hit outbox.FailpointHit) {
			if hit.Name == outbox.FailpointBeforePublish && armed.CompareAndSwap(true, false) {
				holdNotifierLock(t, b, func() { writeOn(t, b, skipper, b.msg("late", 1)) })
			}
		}
		b.startRelay(t, b.pool, b.pub, cfg)
		b.write(t, b.msg("warm-up", 1)) // as in WakesOnNotifyNotOnPoll: now it listens for sure
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "warm-up delivered")
		armed.Store(true)
		b.write(t, b.msg("first", 1))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 3 }, "the skipped writer's row published by the re-check")
		require.False(t, armed.Load(), "the race was not staged")
	})

	t.Run("BrokerOutageKeepsBacklogAndCostsNoAttempts", func(t *testing.T) {
		t.Parallel()
		for _, c := range inFlightCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				got := consume(t, b.amqpURL, b.top.Queue)
				proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
				pub := newPublisherConns(t, proxy.RewriteURL(t, b.amqpURL), c.conns)
				var states sync.Map
				var probes atomic.Int32
				cfg := fastConfig(t)
				cfg.InFlightBatches = c.inFlight
				cfg.MaxAttempts = 2 // an outage that counted attempts would kill the rows at once
				cfg.Hooks.StateChanged = func(c outbox.StateChange) { states.Store(c.To, true) }
				cfg.Hooks.Polled = func(p outbox.Poll) {
					if p.Claimed > 0 {
						probes.Add(1)
					}
				}
				proxy.Cut()
				for i := range 20 {
					b.write(t, b.msg(fmt.Sprintf("agg-%d", i%4), i))
				}
				r := b.startRelay(t, b.pool, pub, cfg)
				testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateBrokerUnavailable }, "relay paused")
				testinfra.Eventually(t, waitFor, func() bool { return probes.Load() >= 5 }, "relay probing the broker")
				require.Equal(t, 20, b.count(t, "attempts = 0 AND dead_at IS NULL AND published_at IS NULL"), "outage counted attempts")

				proxy.Heal()
				testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 20 }, "all rows published after the broker returned")
				testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 20 }, "all rows marked")
				require.Equal(t, outbox.StateRunning, r.State())
				_, sawPause := states.Load(outbox.StateBrokerUnavailable)
				require.True(t, sawPause)
				require.Zero(t, b.count(t, "dead_at IS NOT NULL"))
			})
		}
	})

	t.Run("DatabaseOutageIsSurvived", func(t *testing.T) {
		t.Parallel()
		for _, c := range inFlightCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				got := consume(t, b.amqpURL, b.top.Queue)
				proxy := testinfra.NewProxy(t, hostPort(t, b.pool.Config().ConnString()))
				viaProxy, err := pgxpool.New(ctx, proxy.RewriteURL(t, b.pool.Config().ConnString()))
				require.NoError(t, err)
				t.Cleanup(viaProxy.Close)
				cfg := fastConfig(t)
				cfg.InFlightBatches = c.inFlight
				r := b.startRelay(t, viaProxy, b.pub, cfg)
				b.write(t, b.msg("a", 1))
				testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "published before the outage")

				proxy.Cut()
				testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateDatabaseUnavailable }, "relay paused")
				b.write(t, b.msg("a", 2), b.msg("b", 1))
				proxy.Heal()
				testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 3 }, "published after the database returned")
				testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateRunning }, "relay running again")
			})
		}
	})

	t.Run("ThreeRelaysLoseNothingAndKeepAggregateOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		const aggregates, perAggregate = 30, 15
		cfg := fastConfig(t)
		cfg.BatchSize = 7
		for range 3 {
			b.startRelay(t, b.pool, newPublisher(t, b.amqpURL), cfg)
		}
		// Writers run while the relays drain: each aggregate's rows in separate transactions,
		// aggregates interleaved by concurrent writers.
		var wg sync.WaitGroup
		for w := range 5 {
			wg.Go(func() {
				for n := range perAggregate {
					for a := w; a < aggregates; a += 5 {
						b.write(t, b.msg(fmt.Sprintf("agg-%02d", a), n))
					}
				}
			})
		}
		wg.Wait()
		total := aggregates * perAggregate
		testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == total }, "all %d rows delivered", total)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == total }, "all rows marked")

		// First deliveries of each aggregate arrive in write order.
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
	})

	t.Run("LateCommittingRowIsNotSkipped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		b.startRelay(t, b.pool, b.pub, fastConfig(t))

		// The early transaction takes the smaller seq but commits last.
		early, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer early.Rollback(ctx) //nolint:errcheck
		require.NoError(t, outbox.Add(ctx, early, b.msg("early", 1)))
		b.write(t, b.msg("late", 1))
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "later row published first")
		require.NoError(t, early.Commit(ctx))
		testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 2 }, "earlier row still published")
	})

	t.Run("PoisonRowEndsDeadAndDoesNotBlockOthers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		nowhere := testinfra.DeclareTopology(t, b.amqpURL) // its queue is bound with "#"; unbind it
		unbind(t, b.amqpURL, nowhere)
		var dead atomic.Int32
		cfg := fastConfig(t)
		cfg.MaxAttempts = 3
		cfg.Hooks.BatchDone = func(res outbox.BatchResult) {
			for _, f := range res.Failed {
				if f.Dead {
					dead.Add(1)
				}
			}
		}
		poison := b.msg("agg", 0)
		poison.Exchange = nowhere.Exchange // routed to no queue: returned, every time
		msgs := b.write(t, poison, b.msg("other", 1))
		b.write(t, b.msg("agg", 1)) // behind the poison row in its own aggregate
		b.startRelay(t, b.pool, b.pub, cfg)

		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "dead_at IS NOT NULL") == 1 }, "poison row dead")
		testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 2 }, "other rows published")
		var attempts int
		var lastErr string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT attempts, last_error FROM outbox_messages WHERE id = $1", msgs[0].ID).Scan(&attempts, &lastErr))
		require.Equal(t, 3, attempts)
		require.Contains(t, lastErr, "unroutable")
		require.EqualValues(t, 1, dead.Load())
	})

	t.Run("OversizedPayloadIsDeadAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.MaxMessageBytes = 1024
		big := b.msg("big", 1)
		big.Payload = json.RawMessage(`{"blob":"` + strings.Repeat("x", 2048) + `"}`)
		b.write(t, big, b.msg("small", 1))
		b.startRelay(t, b.pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "small message published")
		testinfra.Eventually(t, waitFor, func() bool {
			// last_error names the class: the permanent mark adds no text of its own.
			return b.count(t, "dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE 'permanent: outbox: message too large: %exceeds MaxMessageBytes%'") == 1
		}, "big row dead after one attempt")
	})

	t.Run("MissingExchangeFailsOnlyItsMessages", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.MaxAttempts = 2
		missing := b.msg("m", 1)
		missing.Exchange = testinfra.UniqueName(t, "missing") // the broker closes the channel: 404
		b.write(t, missing, b.msg("a", 1), b.msg("b", 1), b.msg("c", 1))
		r := b.startRelay(t, b.pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 3 }, "other rows published")
		testinfra.Eventually(t, waitFor, func() bool {
			return b.count(t, "dead_at IS NOT NULL AND last_error LIKE '%NOT_FOUND%'") == 1
		}, "row for the missing exchange dead")
		require.Equal(t, 3, b.count(t, "published_at IS NOT NULL AND attempts = 0"), "healthy rows lost no attempt")
		require.Equal(t, outbox.StateRunning, r.State())
	})

	t.Run("StopsGracefully", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r, err := outbox.NewRelay(b.pool, b.pub, fastConfig(t))
		require.NoError(t, err)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		testinfra.Eventually(t, waitFor, func() bool { return r.State() == outbox.StateRunning }, "running")
		require.Error(t, r.Run(ctx), "a second Run at once is refused")
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Fatal("relay did not stop")
		}
		require.Equal(t, outbox.StateStopped, r.State())
	})

	t.Run("InvalidConfig", func(t *testing.T) {
		t.Parallel()
		pool := &pgxpool.Pool{}
		pub := outbox.Publisher(nil)
		_, err := outbox.NewRelay(pool, pub, outbox.Config{})
		require.Error(t, err)
		b := &fakePublisher{}
		for name, cfg := range map[string]outbox.Config{
			"BatchTooLarge":    {BatchSize: 1_000_000},
			"NegativeBatch":    {BatchSize: -1},
			"MaxBelowBase":     {RetryBaseDelay: time.Minute, RetryMaxDelay: time.Second},
			"NegativeMaxSize":  {MaxMessageBytes: -1},
			"NegativeInFlight": {InFlightBatches: -1},
			"TooManyInFlight":  {InFlightBatches: outbox.MaxInFlightBatches + 1},
		} {
			_, err := outbox.NewRelay(pool, b, cfg)
			require.ErrorContains(t, err, "outbox: invalid relay config: ", name)
		}
		// Every problem at once, as pkg/inbox's configs report them.
		_, err = outbox.NewRelay(pool, b, outbox.Config{BatchSize: -1, MaxAttempts: -1, PollInterval: -time.Second})
		for _, want := range []string{"batch size must be between 0 (default 100) and 10000, got -1",
			"max attempts must be >= 0 (default 10), got -1", "poll interval must be >= 0"} {
			require.ErrorContains(t, err, want)
		}
		_, err = outbox.NewRelay(pool, b, outbox.Config{Tables: outbox.Tables{Messages: "$$"}})
		require.ErrorIs(t, err, outbox.ErrInvalidTables)
	})

	t.Run("WithDefaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := outbox.Config{PublishTimeout: 10 * time.Second, PollInterval: time.Millisecond}.WithDefaults()
		require.NoError(t, err)
		require.Equal(t, outbox.DefaultBatchSize, cfg.BatchSize)
		require.Equal(t, outbox.DefaultMessagesTable, cfg.Tables.Messages)
		require.Equal(t, 10*time.Second+outbox.DefaultClaimTimeoutMargin, cfg.ClaimTimeout, "derived from PublishTimeout")
		require.Equal(t, time.Millisecond, cfg.NotifyRecheck, "at most PollInterval")
		require.Equal(t, outbox.DefaultInFlightBatches, cfg.InFlightBatches)
		require.Equal(t, outbox.DefaultMaxMessageBytes, cfg.MaxMessageBytes)
		require.NotNil(t, cfg.Logger)
		require.NotNil(t, cfg.TracerProvider)
		require.NotNil(t, cfg.Propagator)
		again, err := cfg.WithDefaults()
		require.NoError(t, err)
		require.Equal(t, cfg.ClaimTimeout, again.ClaimTimeout, "idempotent")
		_, err = outbox.Config{ClaimTimeout: time.Second}.WithDefaults()
		require.ErrorContains(t, err, "outbox: invalid relay config: claim timeout")
	})
}

type fakePublisher struct{}

func (fakePublisher) Publish(context.Context, []outbox.Message) []error { return nil }

func unbind(t *testing.T, url string, top testinfra.Topology) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.QueueUnbind(top.Queue, "#", top.Exchange, nil))
}

func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(rawURL)
	if err == nil && strings.HasPrefix(rawURL, "postgres") {
		return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	}
	u, err := amqp.ParseURI(rawURL)
	require.NoError(t, err)
	return fmt.Sprintf("%s:%d", u.Host, u.Port)
}

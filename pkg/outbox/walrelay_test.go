package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestWALRelay runs the WAL relay against a private primary at wal_level=logical and the
// shared broker. One pair serves the subtests, each in a database of its own.
func TestWALRelay(t *testing.T) {
	t.Parallel()
	pair := testinfra.StartLogicalPostgresPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // all its subtests
	defer cancel()

	// setup makes database db with the outbox migrated and its publication, and a bundle
	// (broker topology, publisher) around it. The outbox's tables are the default ones, or
	// the one given.
	setup := func(t *testing.T, db string, tables ...outbox.Tables) (*bundle, string) {
		t.Helper()
		pair.CreateDatabase(t, db)
		url := pair.Primary.URL(db)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		store, err := outbox.NewStore(append(tables, outbox.Tables{})[0])
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx, pool))
		require.NoError(t, store.CreatePublication(ctx, pool, ""))
		require.NoError(t, store.CreatePublication(ctx, pool, ""), "a second time: nothing to do")
		t.Cleanup(func() {
			// A slot keeps its database from being dropped, and its name from the next
			// subtest's relay (a slot's name is the server's). The walsender of a relay just
			// stopped ends a moment later: until then the drop fails ("is active").
			testinfra.Eventually(t, 10*time.Second, func() bool {
				_, err := pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()")
				return err == nil
			}, "the database's slots dropped")
		})
		amqpURL := testinfra.AMQPURL(t)
		b := &bundle{pool: pool, amqpURL: amqpURL, top: testinfra.DeclareTopology(t, amqpURL)}
		b.pub = newPublisher(t, amqpURL)
		return b, url
	}
	// run runs a WAL relay until stop is called (or the test ends) and returns Run's error.
	run := func(t *testing.T, b *bundle, url string, cfg outbox.Config) (w *outbox.WALRelay, stop func() error) {
		t.Helper()
		w, err := outbox.NewWALRelay(b.pool, b.pub, cfg, outbox.WALConfig{URL: url, StatusInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		var once sync.Once
		var runErr error
		stop = func() error {
			once.Do(func() { cancel(); runErr = <-done })
			return runErr
		}
		t.Cleanup(func() { _ = stop() })
		return w, stop
	}
	// streaming runs a relay as run does, and waits until it streams.
	streaming := func(t *testing.T, b *bundle, url string, cfg outbox.Config) (w *outbox.WALRelay, stop func() error) {
		t.Helper()
		w, stop = run(t, b, url, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool { return w.State() == outbox.StateRunning }, "the relay streams")
		return w, stop
	}
	// eventually waits, up to 30 s, for cond.
	eventually := func(t *testing.T, what string, cond func() bool) {
		t.Helper()
		testinfra.Eventually(t, 30*time.Second, cond, "%s", what)
	}
	// firstOrder returns, per aggregate, the ids in the order of their first delivery.
	firstOrder := func(r *received) map[string][]string {
		seen := map[string]bool{}
		order := map[string][]string{}
		for _, d := range r.all() {
			if seen[d.MessageId] {
				continue
			}
			seen[d.MessageId] = true
			agg, _ := d.Headers["aggregate_id"].(string)
			order[agg] = append(order[agg], d.MessageId)
		}
		return order
	}

	t.Run("PublishesEveryRowInCommitOrder", func(t *testing.T) {
		b, url := setup(t, "every_row")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.BatchSize = 50
		cfg.InFlightBatches = 4
		streaming(t, b, url, cfg)

		// Eight writers, each the only writer of its aggregate, in transactions of one to
		// three rows; the stream sees them interleaved.
		const writers, perWriter = 8, 150
		want := map[string][]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range writers {
			agg := fmt.Sprintf("agg-%d", w)
			wg.Go(func() {
				for n := 0; n < perWriter; {
					var msgs []outbox.Message
					for k := 0; k < 1+n%3 && n < perWriter; k++ {
						msgs = append(msgs, b.msg(agg, n))
						n++
					}
					msgs = b.write(t, msgs...)
					mu.Lock()
					for _, m := range msgs {
						want[agg] = append(want[agg], m.ID.String())
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == writers*perWriter })
		require.Equal(t, want, firstOrder(got), "each aggregate's rows in commit order")
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == writers*perWriter })
		require.Zero(t, b.count(t, "last_error IS NOT NULL"), "nothing went through the retry lane")
	})

	t.Run("ConcurrentWritersOfOneAggregateGoOutInCommitOrder", func(t *testing.T) {
		// Two transactions write one aggregate at once; the one that inserted first commits
		// last. The stream has them in commit order, and so does the queue.
		b, url := setup(t, "concurrent")
		got := consume(t, b.amqpURL, b.top.Queue)
		streaming(t, b, url, fastConfig(t))
		first, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer first.Rollback(ctx) //nolint:errcheck // after the commit: nothing
		earlyMsgs := []outbox.Message{b.msg("shared", 0)}
		require.NoError(t, outbox.Add(ctx, first, earlyMsgs...)) // Add gives the slice's messages their ids
		early := earlyMsgs[0]
		late := b.write(t, b.msg("shared", 1))[0]
		eventually(t, "the later insert, committed first, delivered", func() bool { return got.ids()[late.ID.String()] == 1 })
		require.NoError(t, first.Commit(ctx))
		eventually(t, "both delivered", func() bool { return len(got.ids()) == 2 })
		require.Equal(t, []string{late.ID.String(), early.ID.String()}, firstOrder(got)["shared"], "commit order, not insert order")
	})

	t.Run("RowsPendingBeforeTheSlotGoOutThroughTheRetryLane", func(t *testing.T) {
		b, url := setup(t, "before_slot")
		got := consume(t, b.amqpURL, b.top.Queue)
		var want []string
		for n := range 20 {
			want = append(want, b.write(t, b.msg("early", n))[0].ID.String())
		}
		b.write(t, b.msg("other", 0))
		run(t, b, url, fastConfig(t))
		// Once the relay streams, rows of the same aggregate: they wait behind the early
		// ones, in the retry lane.
		eventually(t, "the relay streams", func() bool { return b.count(t, "last_error IS NOT NULL") == 21 })
		for n := 20; n < 30; n++ {
			want = append(want, b.write(t, b.msg("early", n))[0].ID.String())
		}
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == 31 })
		require.Equal(t, want, firstOrder(got)["early"], "the aggregate's rows in order, across the lane and the stream")
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == 31 })
		// The lane emptied, the aggregate streams again.
		late := b.write(t, b.msg("early", 30))[0].ID.String()
		eventually(t, "the late row delivered", func() bool { return got.ids()[late] == 1 })
	})

	t.Run("ASlotWithoutItsHandOverIsCreatedAgain", func(t *testing.T) {
		// A relay died between creating the slot and handing the rows pending then to the
		// retry lane: the slot exists, its record does not, and the rows would be left to
		// nobody (the slot never streams them, the lane takes only rows handed to it).
		b, url := setup(t, "hand_over")
		got := consume(t, b.amqpURL, b.top.Queue)
		var want []string
		for n := range 10 {
			want = append(want, b.write(t, b.msg(fmt.Sprintf("before-%d", n), n))[0].ID.String())
		}
		_, err := b.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", outbox.Tables{}.WALName())
		require.NoError(t, err)
		want = append(want, b.write(t, b.msg("after", 0))[0].ID.String())
		streaming(t, b, url, fastConfig(t))
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == len(want) })
		for _, id := range want {
			require.Equal(t, 1, got.ids()[id])
		}
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == len(want) })
	})

	t.Run("ReadyAndPoolSize", func(t *testing.T) {
		b, url := setup(t, "ready")
		cfg := fastConfig(t)
		cfg.InFlightBatches = 3
		w, err := outbox.NewWALRelay(b.pool, b.pub, cfg, outbox.WALConfig{URL: url})
		require.NoError(t, err)
		require.ErrorContains(t, w.Ready(time.Hour), "WAL relay not started")
		require.Equal(t, outbox.PoolSize{Needed: 8, Max: int(b.pool.Stat().MaxConns())}, w.PoolSize())
		w, stop := streaming(t, b, url, cfg)
		require.NoError(t, w.Ready(0))
		require.NoError(t, stop())
		require.ErrorContains(t, w.Ready(time.Hour), "WAL relay stopped")
	})

	t.Run("SwitchesFromPollingAndBackUnderLoad", func(t *testing.T) {
		// A service moves from the polling relay to the WAL relay and back while writers
		// write, each switch a rolling deploy: the new relay starts before the old one stops.
		// Nothing is lost, each aggregate's rows are first delivered in commit order, and
		// what goes out twice is what both relays published while they overlapped.
		b, url := setup(t, "switch")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.BatchSize = 10
		polling := func() (stop func()) {
			r, err := outbox.NewRelay(b.pool, b.pub, cfg)
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			var once sync.Once
			stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
			t.Cleanup(stop)
			return stop
		}
		const aggregates = 4
		var (
			mu      sync.Mutex
			want    = map[string][]string{}
			total   atomic.Int64
			writers sync.WaitGroup
		)
		stopWriting := make(chan struct{})
		var stopOnce sync.Once
		stopWriters := func() { stopOnce.Do(func() { close(stopWriting) }); writers.Wait() }
		t.Cleanup(stopWriters) // also when the test fails before it stops them
		for a := range aggregates {
			agg := fmt.Sprintf("agg-%d", a)
			writers.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stopWriting:
						return
					case <-time.After(2 * time.Millisecond): // ~500 rows/s together
					}
					id := b.write(t, b.msg(agg, n))[0].ID.String()
					mu.Lock()
					want[agg] = append(want[agg], id)
					mu.Unlock()
					total.Add(1)
				}
			})
		}
		written := func(n int64) {
			t.Helper()
			from := total.Load()
			eventually(t, fmt.Sprintf("%d more rows written", n), func() bool { return total.Load() >= from+n })
		}
		stopPoll := polling()
		written(200)
		_, stopWAL := streaming(t, b, url, cfg) // poll → wal
		written(50)
		stopPoll()
		written(200)
		stopPoll = polling() // wal → poll
		written(50)
		require.NoError(t, stopWAL())
		// Back on polling for good: the slot would keep the WAL from now on. The walsender of
		// the relay just stopped ends a moment after it: until then the drop fails ("is
		// active for PID", failed once in CI).
		eventually(t, "the slot dropped once the stopped relay's walsender ended", func() bool {
			_, err := b.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", outbox.Tables{}.WALName())
			return err == nil
		})
		written(200)
		stopWriters()

		n := int(total.Load())
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == n })
		mu.Lock()
		require.Equal(t, want, firstOrder(got), "each aggregate's rows in commit order")
		mu.Unlock()
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == n })
		dups := 0
		for _, c := range got.ids() {
			dups += c - 1
		}
		t.Logf("%d rows, %d published twice while the relays overlapped", n, dups)
		stopPoll()
	})

	t.Run("SlotStats", func(t *testing.T) {
		b, url := setup(t, "slot_stats")
		store, err := outbox.NewStore(outbox.Tables{})
		require.NoError(t, err)
		read := func() outbox.SlotStats {
			t.Helper()
			st, err := store.ReadSlotStats(ctx, b.pool, "")
			require.NoError(t, err)
			return st
		}
		require.Equal(t, outbox.SlotStats{}, read(), "no slot yet")
		_, stop := streaming(t, b, url, fastConfig(t))
		st := read()
		require.True(t, st.Exists && st.Active && !st.Lost, "%+v", st)
		require.Equal(t, int64(-1), st.SafeBytes, "max_slot_wal_keep_size sets no limit")
		require.NoError(t, stop())
		for n := range 100 {
			b.write(t, b.msg("stats", n))
		}
		st = read()
		require.True(t, st.Exists && !st.Active, "%+v", st)
		require.Greater(t, st.LagBytes, int64(100*100), "100 rows the stopped relay has not confirmed")
		require.GreaterOrEqual(t, st.RetainedBytes, st.LagBytes, "the slot keeps at least what it has not confirmed")
	})

	t.Run("AnInvalidatedSlotIsCreatedAgainAndNothingIsLost", func(t *testing.T) {
		// A relay away for long (dead, or its broker down for hours) and a slot limited by
		// max_slot_wal_keep_size: the server invalidates the slot, which can never stream
		// again. The relay drops it, creates it again, and the rows still pending go out
		// through the retry lane, in their aggregates' order.
		b, url := setup(t, "invalidated")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		_, stop := streaming(t, b, url, cfg)
		var want []string
		for n := range 5 {
			want = append(want, b.write(t, b.msg("agg", n))[0].ID.String())
		}
		eventually(t, "the first rows delivered", func() bool { return len(got.ids()) == 5 })
		require.NoError(t, stop())
		for n := 5; n < 25; n++ {
			want = append(want, b.write(t, b.msg("agg", n))[0].ID.String())
		}
		slot := outbox.Tables{}.WALName()
		invalidateSlot(t, ctx, b.pool, slot)
		store, err := outbox.NewStore(outbox.Tables{})
		require.NoError(t, err)
		st, err := store.ReadSlotStats(ctx, b.pool, "")
		require.NoError(t, err)
		require.True(t, st.Exists && st.Lost && !st.Active, "%+v", st)

		_, stop = streaming(t, b, url, cfg)
		eventually(t, "the pending rows in the retry lane", func() bool { return b.count(t, "last_error IS NOT NULL") == 20 })
		for n := 25; n < 30; n++ {
			want = append(want, b.write(t, b.msg("agg", n))[0].ID.String())
		}
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == 30 })
		require.Equal(t, want, firstOrder(got)["agg"], "the aggregate's rows in order, across the lost slot, the lane and the new slot")
		for _, id := range want {
			require.Equal(t, 1, got.ids()[id], "none had been published before the slot was lost")
		}
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == 30 })
		var status string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status))
		require.NotEqual(t, "lost", status, "a new slot")
		require.NoError(t, stop())
	})

	t.Run("ASlotDroppedMidLoadIsCreatedAgainAndNothingIsLost", func(t *testing.T) {
		// An operator drops the slot (its walsender terminated first, as it must be) while
		// writers write: the relay creates it again at once, and what was pending then goes
		// out through the retry lane; each aggregate's rows keep their order.
		b, url := setup(t, "dropped")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.BatchSize = 10
		cfg.InFlightBatches = 4
		streaming(t, b, url, cfg)
		const aggregates, perAggregate = 4, 100
		want := map[string][]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		written := atomic.Int64{}
		t.Cleanup(wg.Wait) // also when the test fails before it waits for them
		for a := range aggregates {
			agg := fmt.Sprintf("agg-%d", a)
			wg.Go(func() {
				for n := range perAggregate {
					id := b.write(t, b.msg(agg, n))[0].ID.String()
					written.Add(1)
					mu.Lock()
					want[agg] = append(want[agg], id)
					mu.Unlock()
				}
			})
		}
		eventually(t, "a quarter written", func() bool { return written.Load() >= aggregates*perAggregate/4 })
		slot := outbox.Tables{}.WALName()
		eventually(t, "the slot dropped", func() bool {
			// The relay streams it again at once: terminate and drop until the drop wins.
			_, _ = b.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
			_, err := b.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
			return err == nil
		})
		wg.Wait()
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == aggregates*perAggregate })
		require.Equal(t, want, firstOrder(got), "each aggregate's rows in commit order")
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == aggregates*perAggregate })
	})

	t.Run("MetricsOfItsProgressAndCatchUps", func(t *testing.T) {
		// outboxmetrics.Relay on a WAL relay: a catch-up per slot created, by reason, with
		// the rows it handed to the lane; how far behind the stream is while a batch is held.
		b, url := setup(t, "metrics")
		for n := range 5 {
			b.write(t, b.msg("before", n))
		}
		reg := prometheus.NewPedanticRegistry()
		m, err := outboxmetrics.NewRelay(reg, nil)
		require.NoError(t, err)
		value := func(name string, labels ...string) float64 {
			families, err := reg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				if f.GetName() != name {
					continue
				}
			metrics:
				for _, mt := range f.GetMetric() {
					for i := 0; i < len(labels); i += 2 {
						found := false
						for _, l := range mt.GetLabel() {
							found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
						}
						if !found {
							continue metrics
						}
					}
					return mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
				}
			}
			t.Fatalf("no metric %s %v", name, labels)
			return 0
		}
		gate := &gatedPublisher{Publisher: b.pub}
		cfg := fastConfig(t)
		cfg.Hooks = m.Hooks(outbox.Hooks{})
		w, err := outbox.NewWALRelay(b.pool, gate, cfg, outbox.WALConfig{URL: url, StatusInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		t.Cleanup(func() { gate.open(); stop(); <-done })
		eventually(t, "the relay streams", func() bool { return w.State() == outbox.StateRunning })
		eventually(t, "the rows pending before the slot published", func() bool { return b.count(t, "published_at IS NOT NULL") == 5 })
		require.Equal(t, 1.0, value("outbox_wal_catchups_total", "reason", "new"))
		require.Equal(t, 5.0, value("outbox_wal_catchup_rows_total"))
		require.Zero(t, value("outbox_wal_behind_seconds"))

		gate.close()
		b.write(t, b.msg("held", 0))
		eventually(t, "the relay falls behind while the broker holds the batch", func() bool {
			return value("outbox_wal_behind_seconds") > 0.2
		})
		gate.open()
		eventually(t, "caught up", func() bool { return value("outbox_wal_behind_seconds") == 0 })

		slot := outbox.Tables{}.WALName()
		eventually(t, "the slot dropped", func() bool {
			_, _ = b.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
			_, err := b.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
			return err == nil
		})
		eventually(t, "a catch-up counted for the slot gone", func() bool { return value("outbox_wal_catchups_total", "reason", "gone") == 1 })
		require.Equal(t, 1.0, value("outbox_wal_catchups_total", "reason", "new"))
		problems, err := testutil.GatherAndLint(reg)
		require.NoError(t, err)
		require.Empty(t, problems)
	})

	t.Run("RowsGoneFromTheTableDoNotStopTheStream", func(t *testing.T) {
		b, url := setup(t, "gone")
		got := consume(t, b.amqpURL, b.top.Queue)
		_, stop := streaming(t, b, url, fastConfig(t))
		require.NoError(t, stop())
		// One inserted and deleted by the same transaction; one deleted by hand before the
		// relay streams it; rows after each.
		undone := b.msg("undone", 0)
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if err := outbox.Add(ctx, tx, undone); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DELETE FROM outbox_messages WHERE aggregate_id = 'undone'")
			return err
		}))
		b.write(t, b.msg("by-hand", 0))
		_, err := b.pool.Exec(ctx, "DELETE FROM outbox_messages WHERE aggregate_id = 'by-hand'")
		require.NoError(t, err)
		var after []string
		for n := range 5 {
			after = append(after, b.write(t, b.msg(fmt.Sprintf("after-%d", n), n))[0].ID.String())
		}
		streaming(t, b, url, fastConfig(t))
		eventually(t, "the rows after them delivered", func() bool {
			ids := got.ids()
			return !slices.ContainsFunc(after, func(id string) bool { return ids[id] == 0 })
		})
		eventually(t, "and marked", func() bool { return b.count(t, "published_at IS NOT NULL") == len(after) })
	})

	t.Run("DeletePublished", func(t *testing.T) {
		// The stream's marks and the retry lane's delete what they publish; the dead row
		// stays. Then a relay killed after its marks committed, before the slot heard of
		// them: its successor streams the deleted rows again, publishes them again (the
		// window doc.go bounds) and takes their absence for what it is, without a warning.
		b, url := setup(t, "delete_published")
		got := consume(t, b.amqpURL, b.top.Queue)
		var logs lockedBuffer
		cfg := fastConfig(t)
		cfg.DeletePublished = true
		cfg.BatchSize = 20
		cfg.MaxMessageBytes = 1 << 10
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		_, stop := streaming(t, b, url, cfg)
		big := b.msg("big", 0)
		big.Payload = json.RawMessage(`{"p":"` + strings.Repeat("x", 2<<10) + `"}`)
		bigID := b.write(t, big, b.msg("big", 1))[0].ID // its aggregate's next row goes on
		for n := range 100 {
			b.write(t, b.msg("hot", n), b.msg(fmt.Sprintf("spread-%d", n), n))
		}
		eventually(t, "every healthy row delivered", func() bool { return len(got.ids()) == 201 })
		eventually(t, "the published rows deleted, the dead row kept", func() bool { return b.count(t, "true") == 1 })
		require.Equal(t, 1, b.count(t, fmt.Sprintf("id = '%s' AND dead_at IS NOT NULL", bigID)))
		st, err := outbox.ReadStats(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, outbox.Stats{Dead: 1}, st)

		// Requeued (fixed by hand first), the dead row goes out through the retry lane.
		_, err = b.pool.Exec(ctx, `UPDATE outbox_messages SET payload = '{"p":"fixed"}' WHERE id = $1`, bigID)
		require.NoError(t, err)
		n, err := outbox.Requeue(ctx, b.pool, bigID)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		eventually(t, "the requeued row delivered", func() bool { return got.ids()[bigID.String()] == 1 })
		eventually(t, "and deleted", func() bool { return b.count(t, "true") == 0 })
		require.NoError(t, stop())

		var batch []outbox.Message
		for k := range 25 {
			batch = append(batch, b.msg(fmt.Sprintf("killed-%d", k), k))
		}
		b.write(t, batch...) // one commit: one batch
		killedRelayBatching(t, b.pool.Config().ConnString(), b.amqpURL, outbox.FailpointAfterCommit, 1000,
			childWALURL+"="+url, childDeletePublished+"=1")
		require.Zero(t, b.count(t, "true"), "the killed relay's marks committed: its rows are deleted")
		streaming(t, b, url, cfg)
		eventually(t, "the batch published again", func() bool {
			ids := got.ids()
			for _, m := range batch {
				if ids[m.ID.String()] < 2 {
					return false
				}
			}
			return true
		})
		after := b.write(t, b.msg("after", 0))[0].ID.String()
		eventually(t, "the next row delivered", func() bool { return got.ids()[after] >= 1 })
		eventually(t, "and deleted", func() bool { return b.count(t, "true") == 0 })
		require.NotContains(t, logs.String(), "no longer in the table", "rows deleted as published are no surprise")
	})

	t.Run("PoisonIsDeadAndTheStreamGoesOn", func(t *testing.T) {
		b, url := setup(t, "poison")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.MaxMessageBytes = 1 << 10
		run(t, b, url, cfg)
		big := b.msg("big", 0)
		big.Payload = json.RawMessage(`{"p":"` + strings.Repeat("x", 2<<10) + `"}`)
		bigID := b.write(t, big)[0].ID
		// A row written by hand whose headers are not a JSON object of strings.
		_, err := b.pool.Exec(ctx, `INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
			VALUES (gen_random_uuid(), $1, 'k', 'T', 'test', 'hand', '{}', '{"n": 1}')`, b.top.Exchange)
		require.NoError(t, err)
		var healthy []outbox.Message
		for n := range 50 {
			healthy = append(healthy, b.msg(fmt.Sprintf("h%d", n), n))
		}
		b.write(t, healthy...)
		eventually(t, "the healthy rows delivered", func() bool { return len(got.ids()) == 50 })
		eventually(t, "both poison rows dead", func() bool { return b.count(t, "dead_at IS NOT NULL") == 2 })
		var lastErr string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM outbox_messages WHERE id = $1", bigID).Scan(&lastErr))
		require.Contains(t, lastErr, "too large")
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM outbox_messages WHERE aggregate_id = 'hand'").Scan(&lastErr))
		require.Contains(t, lastErr, "headers")
	})

	t.Run("PoisonCorpus", func(t *testing.T) {
		// The polling relay's corpus (TestPoisonCorpus), through the stream: each case's
		// rows are written while the slot exists and no relay runs, then streamed.
		b, url := setup(t, "corpus")
		_, stop := streaming(t, b, url, fastConfig(t))
		require.NoError(t, stop())
		pb := &poisonBundle{bundle: b, t: t}
		pb.start = func(t *testing.T, pub outbox.Publisher, cfg outbox.Config) {
			// The previous case's walsender ends a moment after its relay closed the
			// connection: a relay started before that stands by first, which the corpus
			// would take for an outage.
			testinfra.Eventually(t, 10*time.Second, func() bool {
				var active bool
				err := b.pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", outbox.Tables{}.WALName()).Scan(&active)
				return err == nil && !active
			}, "the previous relay's walsender released the slot")
			w, err := outbox.NewWALRelay(b.pool, pub, cfg, outbox.WALConfig{URL: url, StatusInterval: 100 * time.Millisecond})
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- w.Run(rctx) }()
			t.Cleanup(func() {
				cancel()
				require.NoError(t, <-done)
			})
		}
		for _, c := range poisonCases() {
			if c.want == refusedByAdd {
				continue // Add's refusals: no row, nothing for a relay
			}
			t.Run(c.name, func(t *testing.T) {
				pb.t = t
				pb.reset(t)
				runPoisonCase(t, pb, c, outboxrabbitmq.Config{})
			})
		}
	})

	t.Run("BrokerAlarmAndOutagePauseTheStream", func(t *testing.T) {
		// A private broker: a memory alarm, then the node killed and started again. Each
		// pauses the stream (broker_unavailable) without losing its place or costing an
		// attempt; everything goes out once the broker is back.
		node := testinfra.StartRabbitNode(t)
		b, url := setup(t, "broker")
		b.amqpURL, b.top = node.URL, testinfra.DeclareTopology(t, node.URL)
		b.pub = newPublisher(t, node.URL)
		var mu sync.Mutex
		var states []outbox.State
		state := func() []outbox.State { mu.Lock(); defer mu.Unlock(); return slices.Clone(states) }
		cfg := fastConfig(t)
		cfg.PublishTimeout = 2 * time.Second
		cfg.BatchSize, cfg.InFlightBatches = 5, 4
		cfg.Hooks.StateChanged = func(c outbox.StateChange) { mu.Lock(); states = append(states, c.To); mu.Unlock() }
		w, _ := streaming(t, b, url, cfg)
		b.write(t, b.msg("warm-up", 0))
		eventually(t, "warm-up published", func() bool { return b.count(t, "published_at IS NOT NULL") == 1 })
		// Half the rows are of one aggregate, so that batches wait behind the one before
		// them that the broker did not take (batches of 5, four in flight).
		rows := func(prefix string) []outbox.Message {
			msgs := make([]outbox.Message, 50)
			for i := range msgs {
				msgs[i] = b.msg(fmt.Sprintf("%s-%d", prefix, i), i)
				if i%2 == 0 {
					msgs[i] = b.msg(prefix+"-hot", i)
				}
			}
			return b.write(t, msgs...)
		}

		node.Ctl(t, "set_vm_memory_high_watermark", "0")
		alarmed := true
		defer func() {
			if alarmed {
				node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
			}
		}()
		rows("alarm")
		eventually(t, "the relay reports the broker unavailable", func() bool { return w.State() == outbox.StateBrokerUnavailable })
		require.Zero(t, b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'alarm-%'"), "nothing is published under the alarm")
		node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
		alarmed = false
		eventually(t, "everything published after the alarm", func() bool {
			return b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'alarm-%'") == 50
		})
		eventually(t, "running again", func() bool { return w.State() == outbox.StateRunning })

		node.Kill(t)
		rows("outage")
		eventually(t, "the relay reports the broker unavailable", func() bool { return w.State() == outbox.StateBrokerUnavailable })
		require.NoError(t, w.Ready(time.Hour), "unavailable for less than the grace")
		require.ErrorContains(t, w.Ready(0), "cannot publish to the broker")
		node.Restart(t)
		eventually(t, "everything published after the outage", func() bool {
			return b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'outage-%'") == 50
		})
		require.Zero(t, b.count(t, "dead_at IS NOT NULL OR attempts > 0 OR last_error IS NOT NULL"), "no attempt counted, nothing handed to the lane")
		require.GreaterOrEqual(t, queueDepth(t, node.URL, b.top.Queue), 101, "every row reached the queue, at least once")
		require.Contains(t, state(), outbox.StateBrokerUnavailable)
		require.NotContains(t, state(), outbox.StateDatabaseUnavailable, "the broker's outage is blamed on the broker")
	})

	t.Run("UnroutableGoesToTheRetryLaneAndHoldsItsAggregate", func(t *testing.T) {
		b, url := setup(t, "unroutable")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.MaxAttempts = 3
		run(t, b, url, cfg)
		lost := b.msg("held", 0)
		lost.Exchange = "amq.direct" // routes nowhere
		lostID := b.write(t, lost)[0].ID
		after := b.write(t, b.msg("held", 1))[0].ID.String()
		other := b.write(t, b.msg("free", 0))[0].ID.String()
		eventually(t, "the unroutable row dead after its attempts", func() bool { return b.count(t, "dead_at IS NOT NULL AND attempts = 3") == 1 })
		eventually(t, "the rows after it delivered", func() bool { ids := got.ids(); return ids[after] == 1 && ids[other] == 1 })
		var published bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT published_at IS NOT NULL FROM outbox_messages WHERE id = $1", lostID).Scan(&published))
		require.False(t, published)

		// Routable now, requeued: the lane publishes it again.
		conn, err := amqp.Dial(b.amqpURL)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.QueueBind(q.Name, lost.RoutingKey, "amq.direct", false, nil))
		n, err := outbox.Requeue(ctx, b.pool, lostID)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		eventually(t, "the requeued row published", func() bool {
			return b.count(t, "published_at IS NOT NULL AND id = '"+lostID.String()+"'") == 1
		})
		eventually(t, "and delivered", func() bool {
			q, err := ch.QueueDeclarePassive(q.Name, false, true, true, false, nil) // exclusive: this connection's
			return err == nil && q.Messages == 1
		})
	})

	t.Run("OneAggregateFlowsInBatchesAndWaitsBehindAFailure", func(t *testing.T) {
		// One transaction writes 60 rows of one aggregate: batches of 5, four in flight, each
		// published once the one before it is confirmed. Row 7 routes nowhere: the rest of
		// its batch (8, 9) was sent with it, but no later row goes out before it is settled
		// (dead after its attempts); then they all do, in commit order.
		b, url := setup(t, "one_aggregate")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.BatchSize, cfg.InFlightBatches, cfg.MaxAttempts = 5, 4, 3
		streaming(t, b, url, cfg)
		msgs := make([]outbox.Message, 60)
		for i := range msgs {
			msgs[i] = b.msg("hot", i)
		}
		msgs[7].Exchange = "amq.direct" // routes nowhere
		msgs = b.write(t, msgs...)
		eventually(t, "the unroutable row dead after its attempts", func() bool { return b.count(t, "dead_at IS NOT NULL AND attempts = 3") == 1 })
		eventually(t, "every other row delivered", func() bool { return len(got.ids()) == 59 })
		var want []string
		for i, m := range msgs {
			if i != 7 {
				want = append(want, m.ID.String())
			}
		}
		require.Equal(t, want, firstOrder(got)["hot"], "commit order")
		var overtook int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages o, outbox_messages f
WHERE f.id = $1 AND o.seq > (SELECT seq FROM outbox_messages WHERE id = $2) AND o.published_at < f.dead_at`, msgs[7].ID, msgs[9].ID).Scan(&overtook))
		require.Zero(t, overtook, "no row of a later batch published before the failed row was settled")
		eventually(t, "every other row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == 59 })
	})

	t.Run("RestartsWhereItStopped", func(t *testing.T) {
		b, url := setup(t, "restart")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.BatchSize = 20
		// An outage (a confirm later than PublishTimeout on a loaded machine, say) sends
		// its batch again, as documented: "nothing twice" holds for a run without one.
		var mu sync.Mutex
		var outages []string
		cfg.Hooks.StateChanged = func(c outbox.StateChange) {
			if c.To == outbox.StateBrokerUnavailable || c.To == outbox.StateDatabaseUnavailable {
				mu.Lock()
				outages = append(outages, fmt.Sprintf("%s: %v", c.To, c.Err))
				mu.Unlock()
			}
		}
		_, stop := streaming(t, b, url, cfg)
		var all []string
		for n := range 200 {
			all = append(all, b.write(t, b.msg(fmt.Sprintf("r%d", n%10), n))[0].ID.String())
		}
		eventually(t, "some rows delivered", func() bool { return len(got.ids()) >= 50 })
		require.NoError(t, stop())
		var active bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE database = current_database()").Scan(&active))
		require.False(t, active, "a stopped relay has ended its replication: the slot is free at once, for the next relay")
		for n := 200; n < 300; n++ {
			all = append(all, b.write(t, b.msg(fmt.Sprintf("r%d", n%10), n))[0].ID.String())
		}
		run(t, b, url, cfg)
		eventually(t, "every row delivered", func() bool {
			return len(got.ids()) == 300
		})
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == 300 })
		var twice []int
		for n, id := range all {
			if got.ids()[id] != 1 {
				twice = append(twice, n)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(outages) > 0 {
			t.Logf("rows %v published more than once after the outages %v", twice, outages)
			return
		}
		require.Empty(t, twice, "a stop finishes its batches and tells the server: nothing twice (rows by number)")
	})

	t.Run("KilledAtEachPoint", func(t *testing.T) {
		for i, tc := range []struct {
			failpoint string
			published bool // the broker had the batch when the relay died
			marked    bool // and the table says so
		}{
			{outbox.FailpointBeforePublish, false, false},
			{outbox.FailpointAfterPublish, true, false},
			{outbox.FailpointAfterMark, true, false},
			{outbox.FailpointAfterCommit, true, true},
		} {
			t.Run(tc.failpoint, func(t *testing.T) {
				b, url := setup(t, fmt.Sprintf("killed_%d", i))
				_, stop := streaming(t, b, url, fastConfig(t)) // the slot, before the rows
				require.NoError(t, stop())
				const n = 25
				var msgs []outbox.Message
				for k := range n {
					msgs = append(msgs, b.msg(fmt.Sprintf("order-%d", k), k))
				}
				b.write(t, msgs...) // one commit: one batch

				killedRelayBatching(t, b.pool.Config().ConnString(), b.amqpURL, tc.failpoint, 1000, childWALURL+"="+url)
				if tc.marked {
					require.Equal(t, n, b.count(t, "published_at IS NOT NULL"), "the batch's marks committed")
				} else {
					require.Equal(t, n, b.count(t, "published_at IS NULL"), "the killed relay's marks rolled back")
				}

				effects := consumeThroughInbox(t, b.pool, b.amqpURL, b.top.Queue)
				streaming(t, b, url, fastConfig(t))
				testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == n }, "all rows published after restart")
				testinfra.Eventually(t, waitFor, func() bool { return effects.applied() == n }, "every effect applied")
				var rows, maxApplied int
				require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), coalesce(max(applied), 0) FROM test_effects").Scan(&rows, &maxApplied))
				require.Equal(t, n, rows)
				require.Equal(t, 1, maxApplied)
				if tc.published {
					// The slot had not heard of the batch: it is streamed, and published, again.
					testinfra.Eventually(t, waitFor, func() bool { return effects.duplicates() == n }, "the batch published again")
				} else {
					require.Zero(t, effects.duplicates())
				}
				require.Zero(t, b.count(t, "last_error IS NOT NULL"), "the stream published it all")
			})
		}
	})

	t.Run("KilledDuringACatchUp", func(t *testing.T) {
		// The rows pending when the slot is created go out through the retry lane (a
		// catch-up); the relay is SIGKILLed once the broker confirmed the lane's batch,
		// before its marks. Restarted, it streams its slot, and the lane publishes the
		// catch-up's rows again: nothing lost, the inbox absorbs the batch it had.
		b, url := setup(t, "killed_catchup")
		const n = 25
		var msgs []outbox.Message
		for k := range n {
			msgs = append(msgs, b.msg(fmt.Sprintf("order-%d", k), k))
		}
		b.write(t, msgs...) // before the slot: the stream never has them
		killedRelayBatching(t, b.pool.Config().ConnString(), b.amqpURL, outbox.FailpointLaneAfterPublish, 1000, childWALURL+"="+url)
		require.Equal(t, n, b.count(t, "published_at IS NULL AND last_error IS NOT NULL"), "handed to the lane, not marked")

		effects := consumeThroughInbox(t, b.pool, b.amqpURL, b.top.Queue)
		streaming(t, b, url, fastConfig(t))
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == n }, "all rows published after restart")
		testinfra.Eventually(t, waitFor, func() bool { return effects.applied() == n }, "every effect applied")
		var rows, maxApplied int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), coalesce(max(applied), 0) FROM test_effects").Scan(&rows, &maxApplied))
		require.Equal(t, n, rows)
		require.Equal(t, 1, maxApplied)
		testinfra.Eventually(t, waitFor, func() bool { return effects.duplicates() == n }, "the lane's batch published again")
	})

	t.Run("ASlotOfAnotherDatabaseIsNotTaken", func(t *testing.T) {
		// Two outboxes on one server, in two databases, with the same table name: a slot's
		// name is the server's, so the second relay must not take, or drop, the first's
		// slot (streaming or not); it stops with a set-up error naming the setting, and runs
		// on a slot of its own.
		a, urlA := setup(t, "slot_owner")
		b, urlB := setup(t, "slot_other")
		gotA := consume(t, a.amqpURL, a.top.Queue)
		_, stopA := streaming(t, a, urlA, fastConfig(t))
		slot := outbox.Tables{}.WALName()
		var pid int
		require.NoError(t, a.pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid))

		check := func(t *testing.T) {
			t.Helper()
			w, err := outbox.NewWALRelay(b.pool, b.pub, fastConfig(t), outbox.WALConfig{URL: urlB})
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = w.Run(rctx)
			require.ErrorIs(t, err, outbox.ErrWALSetup)
			require.ErrorContains(t, err, "is database slot_owner's")
			require.ErrorContains(t, err, "WALConfig.Slot")
		}
		check(t)
		var still int
		require.NoError(t, a.pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&still))
		require.Equal(t, pid, still, "the first relay still streams its slot")
		id := a.write(t, a.msg("a", 0))[0].ID.String()
		eventually(t, "the first outbox still published", func() bool { return gotA.ids()[id] == 1 })

		require.NoError(t, stopA())
		check(t) // not streamed now: still not this relay's to drop
		require.Equal(t, 1, a.count(t, "true"), "the first outbox's rows as they were")

		gotB := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		w, err := outbox.NewWALRelay(b.pool, b.pub, cfg, outbox.WALConfig{URL: urlB, Slot: "slot_other_outbox"})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		eventually(t, "a relay on a slot of its own streams", func() bool { return w.State() == outbox.StateRunning })
		idB := b.write(t, b.msg("b", 0))[0].ID.String()
		eventually(t, "the second outbox published", func() bool { return gotB.ids()[idB] == 1 })
	})

	t.Run("PartitionedTable", func(t *testing.T) {
		tables := outbox.Tables{Partition: time.Hour}
		b, url := setup(t, "partitioned", tables)
		var viaRoot bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", tables.WALName()).Scan(&viaRoot))
		require.True(t, viaRoot, "the publication streams the rows as the table's")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		cfg.Tables = tables
		cfg.BatchSize = 50
		_, stop := streaming(t, b, url, cfg)

		// One aggregate's rows, in an old partition made by hand and in the current one,
		// in turn: they go out in commit order.
		var now time.Time
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&now))
		hour := now.Truncate(time.Hour)
		_, err := b.pool.Exec(ctx, fmt.Sprintf("CREATE TABLE old PARTITION OF outbox_messages FOR VALUES FROM ('%s') TO ('%s')",
			hour.Add(-3*time.Hour).UTC().Format(time.RFC3339), hour.Add(-2*time.Hour).UTC().Format(time.RFC3339)))
		require.NoError(t, err)
		var want []string
		for n := range 100 {
			m := b.msg("one", n)
			if n%2 == 1 {
				want = append(want, b.write(t, m)[0].ID.String())
				continue
			}
			id := uuid.New()
			_, err := b.pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::json, $8)`,
				id, m.Exchange, m.RoutingKey, m.Type, m.AggregateType, m.AggregateID, string(m.Payload), hour.Add(-150*time.Minute))
			require.NoError(t, err)
			want = append(want, id.String())
		}
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == 100 })
		require.Equal(t, map[string][]string{"one": want}, firstOrder(got), "in commit order across partitions")
		eventually(t, "every row marked published", func() bool { return b.count(t, "published_at IS NOT NULL") == 100 })

		// The old partition dropped under the stream: it goes on.
		store, err := outbox.NewStore(tables)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = published_at - interval '2 hours'") // past the retention
		require.NoError(t, err)
		deleted, err := store.Cleanup(ctx, b.pool, outbox.CleanupConfig{Retention: time.Hour})
		require.NoError(t, err)
		require.EqualValues(t, 50, deleted, "the old partition's rows; the current one's are left whole")
		var gone bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT to_regclass('old') IS NULL").Scan(&gone))
		require.True(t, gone, "the old partition is dropped")
		more := b.write(t, b.msg("one", 100))[0].ID.String()
		eventually(t, "a row written after the drop delivered", func() bool { return got.ids()[more] == 1 })
		require.NoError(t, stop())

		// A publication of the table that streams its rows as their partitions' is refused,
		// saying what to change.
		_, err = b.pool.Exec(ctx, "CREATE PUBLICATION leaves FOR TABLE outbox_messages WITH (publish = 'insert')")
		require.NoError(t, err)
		w, err := outbox.NewWALRelay(b.pool, b.pub, cfg, outbox.WALConfig{URL: url, Publication: "leaves"})
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = w.Run(rctx)
		require.ErrorIs(t, err, outbox.ErrWALSetup)
		require.ErrorContains(t, err, "publish_via_partition_root = true")
	})

	t.Run("SetUpErrors", func(t *testing.T) {
		b, url := setup(t, "setup_errors")
		cfg := fastConfig(t)
		check := func(t *testing.T, url, publication, want string) {
			t.Helper()
			w, err := outbox.NewWALRelay(b.pool, b.pub, cfg, outbox.WALConfig{URL: url, Publication: publication})
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = w.Run(rctx)
			require.ErrorIs(t, err, outbox.ErrWALSetup)
			require.Contains(t, err.Error(), want)
		}
		t.Run("NoPublication", func(t *testing.T) { check(t, url, "missing", "Store.CreatePublication") })
		for _, pc := range []struct{ name, create, want string }{
			{"RowFilter", "CREATE PUBLICATION filtered FOR TABLE outbox_messages WHERE (aggregate_type <> 'x') WITH (publish = 'insert')", "row filter"},
			{"ColumnList", "CREATE PUBLICATION narrow FOR TABLE outbox_messages (id, seq, exchange) WITH (publish = 'insert')", "column list"},
			{"UpdatesOnly", "CREATE PUBLICATION updates FOR TABLE outbox_messages WITH (publish = 'update')", "INSERTs"},
		} {
			t.Run(pc.name, func(t *testing.T) {
				_, err := b.pool.Exec(ctx, pc.create)
				require.NoError(t, err)
				check(t, url, strings.Fields(pc.create)[2], pc.want)
			})
		}
		t.Run("APublicationOfTheSchemaWillDo", func(t *testing.T) {
			_, err := b.pool.Exec(ctx, "CREATE PUBLICATION whole FOR TABLES IN SCHEMA public WITH (publish = 'insert')")
			require.NoError(t, err)
			store, err := outbox.NewStore(outbox.Tables{})
			require.NoError(t, err)
			require.NoError(t, store.CreatePublication(ctx, b.pool, "whole"), "it holds the table: nothing to do")
		})
		t.Run("NoReplicationRole", func(t *testing.T) {
			_, err := b.pool.Exec(ctx, "CREATE ROLE app LOGIN")
			require.NoError(t, err)
			check(t, strings.Replace(url, "postgres@", "app@", 1), "", "REPLICATION")
		})
		t.Run("DeletePublishedWithoutTheDeletePrivilege", func(t *testing.T) {
			for _, q := range []string{
				"CREATE ROLE nodelete LOGIN REPLICATION",
				"GRANT SELECT, UPDATE ON outbox_messages TO nodelete",
				"GRANT SELECT, INSERT, DELETE ON outbox_messages_wal_slots TO nodelete",
			} {
				_, err := b.pool.Exec(ctx, q)
				require.NoError(t, err, q)
			}
			roleURL := strings.Replace(url, "postgres@", "nodelete@", 1)
			pool, err := pgxpool.New(ctx, roleURL)
			require.NoError(t, err)
			defer pool.Close()
			cfg := cfg
			cfg.DeletePublished = true
			w, err := outbox.NewWALRelay(pool, b.pub, cfg, outbox.WALConfig{URL: roleURL})
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = w.Run(rctx)
			require.ErrorIs(t, err, outbox.ErrWALSetup)
			require.Contains(t, err.Error(), "GRANT DELETE ON")
		})
		t.Run("WALLevelReplica", func(t *testing.T) {
			// The shared server runs at wal_level=replica.
			shared := testinfra.NewPool(t)
			require.NoError(t, outbox.Migrate(ctx, shared))
			store, err := outbox.NewStore(outbox.Tables{})
			require.NoError(t, err)
			var exists bool
			require.NoError(t, shared.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", outbox.Tables{}.WALName()).Scan(&exists))
			if !exists {
				err := store.CreatePublication(ctx, shared, "")
				var pgErr interface{ SQLState() string }
				if errors.As(err, &pgErr) && pgErr.SQLState() == "23505" {
					err = nil // another test made it at the same moment
				}
				require.NoError(t, err)
			}
			w, err := outbox.NewWALRelay(shared, b.pub, cfg, outbox.WALConfig{URL: shared.Config().ConnString()})
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = w.Run(rctx)
			require.ErrorIs(t, err, outbox.ErrWALSetup)
			require.Contains(t, err.Error(), "wal_level")
		})
	})

	t.Run("ReadsTheSlotOnlyOnce", func(t *testing.T) {
		b, url := setup(t, "one_reader")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		_, stop1 := run(t, b, url, cfg)
		first := b.write(t, b.msg("a", 0))[0].ID.String()
		eventually(t, "the first relay streams", func() bool { return got.ids()[first] == 1 })
		second, stop2 := run(t, b, url, cfg)
		eventually(t, "the second relay stands by", func() bool { return second.State() == outbox.StateStandby })
		require.NoError(t, second.Ready(0), "a standby is ready")
		require.NoError(t, stop1())
		stopped := time.Now()
		next := b.write(t, b.msg("a", 1))[0].ID.String()
		eventually(t, "the second takes over", func() bool { return got.ids()[next] == 1 })
		t.Logf("the standby took over and published %s after the first stopped", time.Since(stopped).Round(time.Millisecond))
		require.NoError(t, stop2())
		require.Equal(t, 1, got.ids()[first])
	})

	t.Run("AStandbyTakesOverFromARelayThatLostItsWalsender", func(t *testing.T) {
		// The server ends the walsender of a relay that stopped answering (paused past
		// wal_sender_timeout, or cut off): here it is terminated, as the timeout would. A
		// standby takes the slot; the relay that lost it stands by in turn, and publishes
		// nothing beside it.
		b, url := setup(t, "lost_walsender")
		got := consume(t, b.amqpURL, b.top.Queue)
		cfg := fastConfig(t)
		r1, stop1 := streaming(t, b, url, cfg)
		r2, stop2 := run(t, b, url, cfg)
		eventually(t, "the second relay stands by", func() bool { return r2.State() == outbox.StateStandby })
		var want []string
		for n := range 10 {
			want = append(want, b.write(t, b.msg("a", n))[0].ID.String())
		}
		eventually(t, "the first rows delivered", func() bool { return len(got.ids()) == 10 })
		slot := outbox.Tables{}.WALName()
		var old int64
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&old))
		_, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", old)
		require.NoError(t, err)
		eventually(t, "one relay streams, the other stands by", func() bool {
			s1, s2 := r1.State(), r2.State()
			return (s1 == outbox.StateRunning && s2 == outbox.StateStandby) || (s1 == outbox.StateStandby && s2 == outbox.StateRunning)
		})
		for n := 10; n < 50; n++ {
			want = append(want, b.write(t, b.msg("a", n))[0].ID.String())
		}
		eventually(t, "every row delivered", func() bool { return len(got.ids()) == 50 })
		require.Equal(t, want, firstOrder(got)["a"])
		for _, id := range want[10:] {
			require.Equal(t, 1, got.ids()[id], "the rows after the hand-over published once: by one relay")
		}
		require.NoError(t, stop1())
		require.NoError(t, stop2())
	})

}

// invalidateSlot makes the server invalidate an inactive slot, as it does when a slot keeps
// more WAL than max_slot_wal_keep_size: it lowers the limit to 1 MB, writes and switches WAL
// past the slot's position, and checkpoints, until the slot's wal_status is "lost"; then it
// lifts the limit again.
func invalidateSlot(t *testing.T, ctx context.Context, db *pgxpool.Pool, slot string) {
	t.Helper()
	_, err := db.Exec(ctx, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		_, _ = db.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	_, err = db.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "CREATE TABLE IF NOT EXISTS wal_filler (n int)")
	require.NoError(t, err)
	testinfra.Eventually(t, 30*time.Second, func() bool {
		for _, q := range []string{"INSERT INTO wal_filler VALUES (1)", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			_, err := db.Exec(ctx, q)
			require.NoError(t, err)
		}
		var status string
		require.NoError(t, db.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status))
		return status == "lost"
	}, "slot %s invalidated", slot)
	_, err = db.Exec(ctx, "ALTER SYSTEM RESET max_slot_wal_keep_size")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
}

func TestCreatePublicationManyAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Eight processes starting at once, each setting up its database for the WAL relay
	// (any wal_level will do to create a publication).
	for round := range 10 {
		pool := testinfra.NewPool(t)
		require.NoError(t, outbox.Migrate(ctx, pool))
		store, err := outbox.NewStore(outbox.Tables{})
		require.NoError(t, err)
		errs := make(chan error, 8)
		start := make(chan struct{})
		for range 8 {
			go func() {
				<-start
				errs <- store.CreatePublication(ctx, pool, "")
			}()
		}
		close(start)
		for range 8 {
			require.NoError(t, <-errs, "round %d", round)
		}
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1", outbox.Tables{}.WALName()).Scan(&n))
		require.Equal(t, 1, n)
	}
}

// gatedPublisher holds every Publish while closed (until open, or its context ends).
type gatedPublisher struct {
	outbox.Publisher
	gate atomic.Pointer[chan struct{}]
}

func (p *gatedPublisher) close() {
	ch := make(chan struct{})
	p.gate.Store(&ch)
}

func (p *gatedPublisher) open() {
	if ch := p.gate.Swap(nil); ch != nil {
		close(*ch)
	}
}

func (p *gatedPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if ch := p.gate.Load(); ch != nil {
		select {
		case <-*ch:
		case <-ctx.Done():
		}
	}
	return p.Publisher.Publish(ctx, msgs)
}

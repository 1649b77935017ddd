package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// recorder is a Publisher that confirms in memory, so that a test exercises the relay and
// PostgreSQL alone. outcome, when set, decides each message's fate instead.
type recorder struct {
	mu        sync.Mutex
	published []outbox.Message // in the order confirmed, duplicates included
	calls     int
	outcome   func(m outbox.Message) error
}

func (p *recorder) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	for i, m := range msgs {
		if p.outcome != nil {
			errs[i] = p.outcome(m)
		}
		if errs[i] == nil {
			p.published = append(p.published, m)
		}
	}
	return errs
}

func (p *recorder) all() []outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.published)
}

func (p *recorder) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.published)
}

func (p *recorder) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// requireAggregateOrder fails unless, for every aggregate, the first publication of each row
// came in the order the rows were written (want lists each aggregate's ids in write order),
// and every row was published.
func requireAggregateOrder(t *testing.T, want map[string][]uuid.UUID, published []outbox.Message) {
	t.Helper()
	got := map[string][]uuid.UUID{}
	seen := map[uuid.UUID]bool{}
	for _, m := range published {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		got[m.AggregateID] = append(got[m.AggregateID], m.ID)
	}
	for agg, ids := range want {
		require.Equal(t, ids, got[agg], "aggregate %s published out of order or incompletely", agg)
	}
}

func quietConfig(t *testing.T) outbox.Config {
	cfg := fastConfig(t)
	cfg.PollInterval = 20 * time.Millisecond
	return cfg
}

// TestHotAggregate shows that one aggregate's long backlog neither stalls nor slows the others,
// and that its rows still go out in order.
func TestHotAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BacklogLeavesTheClaimAndDrainsInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const hot = 600
		want := map[string][]uuid.UUID{}
		msgs := make([]outbox.Message, hot)
		for i := range msgs {
			msgs[i] = b.msg("hot", i)
		}
		b.write(t, msgs...)
		want["hot"] = ids(msgs)
		for i := range 100 {
			m := b.write(t, b.msg(fmt.Sprintf("cold-%d", i), i))
			want[m[0].AggregateID] = ids(m)
		}

		pub := &recorder{}
		cfg := quietConfig(t)
		r, err := outbox.NewRelay(b.pool, pub, cfg)
		require.NoError(t, err)
		// The first cycle walks the backlog once; the maintenance of the first cycles takes
		// the hot aggregate's non-head rows out of the claim's index.
		for range 3 {
			_, err := r.PublishBatch(ctx)
			require.NoError(t, err)
		}
		require.Greater(t, b.count(t, "waiting"), hot/2, "the hot aggregate's later rows wait outside the claim index")
		require.Zero(t, b.count(t, "waiting AND aggregate_id <> 'hot'"), "no other aggregate's row waits")
		testinfra.Eventually(t, waitFor, func() bool {
			_, err := r.PublishBatch(ctx)
			require.NoError(t, err)
			return b.count(t, "aggregate_id LIKE 'cold-%' AND published_at IS NULL") == 0
		}, "every other aggregate published while the hot one drains")

		b.startRelay(t, b.pool, pub, cfg)
		// One row of an aggregate per cycle: give a busy machine time.
		testinfra.Eventually(t, 3*waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "all published")
		require.Zero(t, b.count(t, "waiting"))
		requireAggregateOrder(t, want, pub.all())
	})

	// Three relays, rows written while they run, failures and refusals on the way: every
	// aggregate's rows are published in write order, none is left waiting.
	t.Run("ThreeRelaysWritersAndFailuresKeepOrder", func(t *testing.T) {
		t.Parallel()
		for _, c := range inFlightCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				const aggregates, perAggregate = 50, 60
				var mu sync.Mutex
				want := map[string][]uuid.UUID{}
				// A row fails (an attempt) or is refused (no attempt) now and then, at most twice.
				var failures sync.Map
				pub := &recorder{outcome: func(m outbox.Message) error {
					n, _ := failures.LoadOrStore(m.ID, new(atomic.Int32))
					if n.(*atomic.Int32).Add(1) > 2 {
						return nil
					}
					switch rand.N(10) {
					case 0:
						return errors.New("nacked")
					case 1:
						return fmt.Errorf("queue full: %w", outbox.ErrRefused)
					case 2:
						return fmt.Errorf("channel closed: %w", outbox.ErrNotSent)
					}
					return nil
				}}
				cfg := quietConfig(t)
				cfg.BatchSize = 40
				cfg.InFlightBatches = c.inFlight
				for range 3 {
					b.startRelay(t, b.pool, pub, cfg)
				}
				var wg sync.WaitGroup
				for w := range 5 {
					wg.Go(func() {
						// Writers of one aggregate are serialised, as README.md#ordering asks:
						// each writer owns ten aggregates.
						for i := range perAggregate {
							for a := w * aggregates / 5; a < (w+1)*aggregates/5; a++ {
								agg := fmt.Sprintf("agg-%d", a)
								m := b.write(t, b.msg(agg, i))
								mu.Lock()
								want[agg] = append(want[agg], m[0].ID)
								mu.Unlock()
							}
						}
					})
				}
				wg.Wait()
				testinfra.Eventually(t, 2*waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "all published")
				require.Zero(t, b.count(t, "dead_at IS NOT NULL"))
				require.Zero(t, b.count(t, "waiting"))
				requireAggregateOrder(t, want, pub.all())
			})
		}
	})

	t.Run("RowsBehindARetryDrainWithoutWaitingForThePoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var once atomic.Bool
		pub := &recorder{outcome: func(m outbox.Message) error {
			if m.AggregateID == "a" && once.CompareAndSwap(false, true) {
				return errors.New("nacked once")
			}
			return nil
		}}
		cfg := fastConfig(t)
		cfg.PollInterval = time.Hour // only re-checks can find the retried row and those behind it
		cfg.DisableNotify = true
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = 20*time.Millisecond, 20*time.Millisecond
		msgs := make([]outbox.Message, 11)
		for i := range msgs {
			msgs[i] = b.msg("a", i)
		}
		b.write(t, msgs...)
		b.startRelay(t, b.pool, pub, cfg)
		defer func() {
			if t.Failed() {
				rows, _ := b.pool.Query(ctx, "SELECT seq, waiting, attempts, next_attempt_at - now(), published_at IS NOT NULL FROM outbox_messages ORDER BY seq")
				for rows.Next() {
					v, _ := rows.Values()
					t.Log(v...)
				}
			}
		}()
		testinfra.Eventually(t, 5*time.Second, func() bool { return b.count(t, "published_at IS NULL") == 0 },
			"the failed row and the ten behind it published by re-checks, not after a poll interval")
		requireAggregateOrder(t, map[string][]uuid.UUID{"a": ids(msgs)}, pub.all())
	})
}

// alternating refuses every message of every other call, and publishes the others.
type alternating struct {
	*recorder
	calls *atomic.Int64
}

func (p *alternating) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if p.calls.Add(1)%2 == 0 {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = fmt.Errorf("queue full: %w", outbox.ErrRefused)
		}
		return errs
	}
	return p.recorder.Publish(ctx, msgs)
}

// TestNotTheMessagesFault covers the outcomes that must cost a row no attempt, and what keeps
// each of them from looping.
func TestNotTheMessagesFault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RefusedRowsAreRetriedLaterWithoutAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var refuse atomic.Bool
		refuse.Store(true)
		pub := &recorder{outcome: func(outbox.Message) error {
			if refuse.Load() {
				return fmt.Errorf("queue full: %w", outbox.ErrRefused)
			}
			return nil
		}}
		cfg := quietConfig(t)
		cfg.MaxAttempts = 2
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = 5*time.Millisecond, 50*time.Millisecond
		logger, logs := testinfra.NewLogs(t)
		cfg.Logger = logger
		b.write(t, b.msg("a", 1), b.msg("b", 1))
		r := b.startRelay(t, b.pool, pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return pub.callCount() >= 10 }, "refused again and again")
		require.Equal(t, outbox.StateRunning, r.State(), "a refusal is no outage")
		require.Zero(t, b.count(t, "attempts > 0 OR dead_at IS NOT NULL"), "refusals cost no attempt")
		require.Equal(t, 2, b.count(t, "last_error LIKE '%refused by the broker%'"))
		refuse.Store(false)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "published once accepted")
		// The refusals are the broker's doing: said once when they start and once when they
		// end, not once per message and cycle.
		const what = "outbox relay: the broker refuses messages"
		testinfra.Eventually(t, waitFor, func() bool { return logs.Count(slog.LevelInfo, what+": recovered") == 1 }, "the end of the refusals said")
		require.Equal(t, 1, logs.Count(slog.LevelWarn, ""), "one warning for %d refusals\n%s", pub.callCount(), logs.String(slog.LevelInfo))
		require.Equal(t, 1, logs.Count(slog.LevelWarn, what+": failing"))
	})

	t.Run("RefusalsOfSomeBatchesAreSaidOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A queue at its length limit: the broker accepts one batch and refuses the next.
		var calls atomic.Int64
		pub := &alternating{recorder: &recorder{}, calls: &calls}
		cfg := quietConfig(t)
		cfg.BatchSize = 5
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = time.Millisecond, 5*time.Millisecond
		logger, logs := testinfra.NewLogs(t)
		cfg.Logger = logger
		var msgs []outbox.Message
		for i := range 200 {
			msgs = append(msgs, b.msg(fmt.Sprintf("agg-%d", i), 0))
		}
		b.write(t, msgs...)
		b.startRelay(t, b.pool, pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "every row published between the refusals")
		require.Greater(t, calls.Load(), int64(40), "batches alternately accepted and refused")
		const what = "outbox relay: the broker refuses messages"
		testinfra.Eventually(t, waitFor, func() bool { return logs.Count(slog.LevelInfo, what+": recovered") == 1 }, "the end of the refusals said")
		require.Equal(t, 1, logs.Count(slog.LevelWarn, what+": failing"), "%d batches, half refused: one streak\n%s", calls.Load(), logs.String(slog.LevelInfo))
		require.Equal(t, 1, logs.Count(slog.LevelInfo, what+": recovered"))
	})

	t.Run("RowNeverSentCountsAttemptsAfterAStreak", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := &recorder{outcome: func(m outbox.Message) error {
			if m.AggregateID == "stuck" {
				return fmt.Errorf("publisher skipped it: %w", outbox.ErrNotSent)
			}
			return nil
		}}
		cfg := quietConfig(t)
		cfg.MaxAttempts = 2
		stuck := b.write(t, b.msg("stuck", 1))[0]
		b.startRelay(t, b.pool, pub, cfg)
		for i := range 100 {
			b.write(t, b.msg(fmt.Sprintf("healthy-%d", i), i))
		}
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "dead_at IS NOT NULL") == 1 }, "the row never sent ends dead")
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == 100 }, "the others published")
		dead, err := outbox.ListDead(ctx, b.pool, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, stuck.ID, dead[0].ID)
		require.Contains(t, dead[0].LastError, "not sent 5 times in a row")
	})

	t.Run("NothingSentBacksOff", func(t *testing.T) {
		t.Parallel()
		for _, c := range inFlightCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pub := &recorder{outcome: func(outbox.Message) error { return outbox.ErrNotSent }}
				cfg := quietConfig(t)
				cfg.OutageBaseDelay, cfg.OutageMaxDelay = 50*time.Millisecond, 200*time.Millisecond
				cfg.MaxAttempts = 1000
				cfg.InFlightBatches = c.inFlight
				for i := range 5 {
					b.write(t, b.msg(fmt.Sprintf("a-%d", i), i))
				}
				start := time.Now()
				b.startRelay(t, b.pool, pub, cfg)
				testinfra.Eventually(t, waitFor, func() bool { return pub.callCount() >= 8 }, "cycles go on")
				// Eight cycles with a backoff of 50, 100, 200, 200 … ms between them take at least
				// half a second (the jitter halves a delay at most); without a backoff they would
				// take a few milliseconds.
				require.Greater(t, time.Since(start), 400*time.Millisecond, "a relay that sends nothing backs off")
			})
		}
	})
}

// TestPayloadIsKeptVerbatim: the bytes Add received are the bytes published.
func TestPayloadIsKeptVerbatim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	payloads := []string{
		`{"b":1,  "a":2}`,
		`{"a":1,"a":2}`,
		`{"nul":"\u0000","emoji":"\ud83d\ude00"}`,
		"[1,\n 2.50, 1e3]",
		`"just a string"`,
	}
	var want []outbox.Message
	for i, p := range payloads {
		m := b.msg(fmt.Sprintf("p-%d", i), i)
		m.Payload = json.RawMessage(p)
		want = append(want, b.write(t, m)...)
	}
	pub := &recorder{}
	r, err := outbox.NewRelay(b.pool, pub, quietConfig(t))
	require.NoError(t, err)
	_, err = r.PublishBatch(ctx)
	require.NoError(t, err)
	got := map[uuid.UUID]string{}
	for _, m := range pub.all() {
		got[m.ID] = string(m.Payload)
	}
	for i, m := range want {
		require.Equal(t, payloads[i], got[m.ID])
	}
}

// TestListDeadReadsAnyRow: the rows that die for being unreadable are listed too.
func TestListDeadReadsAnyRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers, dead_at)
VALUES (gen_random_uuid(), 'x', 'k', 'T', 'test', 'numbers', '{}', '{"n": 1, "obj": {"a": [1, null]}, "s": "ok", "nil": null}', now()),
       (gen_random_uuid(), 'x', 'k', 'T', 'test', 'array', '{}', '[1, 2]', now())`)
	require.NoError(t, err)
	dead, err := outbox.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	byAgg := map[string]map[string]string{}
	for _, d := range dead {
		byAgg[d.AggregateID] = d.Headers
	}
	require.Equal(t, map[string]string{"n": "1", "obj": `{"a": [1, null]}`, "s": "ok", "nil": "null"}, byAgg["numbers"])
	require.Equal(t, map[string]string{"": "[1, 2]"}, byAgg["array"])
}

// TestStatsOldestIsByAge: a row of a transaction that began earlier counts as older, whatever
// its seq.
func TestStatsOldestIsByAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	early, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer early.Rollback(ctx) //nolint:errcheck
	var began time.Time
	require.NoError(t, early.QueryRow(ctx, "SELECT now()").Scan(&began))
	b.write(t, b.msg("later", 1)) // a smaller seq, a later transaction
	require.NoError(t, outbox.Add(ctx, early, b.msg("earlier", 1)))
	require.NoError(t, early.Commit(ctx))
	s, err := outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 2, s.Pending)
	require.WithinDuration(t, began, s.OldestPending, time.Millisecond)
}

// TestMigrateUnderLoad runs Migrate again and again while writers add at full speed and two
// relays drain, as every replica of a rolling deploy does at start-up.
func TestMigrateUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CurrentSchema", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := &recorder{}
		cfg := quietConfig(t)
		for range 2 {
			b.startRelay(t, b.pool, pub, cfg)
		}
		// Another process's pool, on the same database.
		mpool, err := pgxpool.New(ctx, b.pool.Config().ConnString())
		require.NoError(t, err)
		defer mpool.Close()

		stop := make(chan struct{})
		var measuring atomic.Bool // after the warm-up: pools filled, relays listening
		var slowest, written, measured atomic.Int64
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					b.write(t, b.msg(fmt.Sprintf("w%d-%d", w, i%20), i))
					d := time.Since(start).Nanoseconds()
					written.Add(1)
					if !measuring.Load() {
						continue
					}
					measured.Add(1)
					for {
						old := slowest.Load()
						if d <= old || slowest.CompareAndSwap(old, d) {
							break
						}
					}
				}
			})
		}
		testinfra.Eventually(t, waitFor, func() bool { return pub.count() > 100 }, "writers and relays warmed up")
		// Watch for any session of the database waiting on a lock, as writers queued behind
		// a migration's table lock would.
		watcher := b.conn(t)
		lockWaits := map[string]int{}
		watched := make(chan struct{})
		measuring.Store(true)
		go func() {
			defer close(watched)
			for measuring.Load() {
				rows, err := watcher.Query(ctx, `
					SELECT l.locktype || ' ' || l.mode || ': ' || left(a.query, 60)
					FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
					WHERE NOT l.granted AND a.datname = current_database()
					  AND l.locktype IN ('relation', 'tuple', 'transactionid', 'advisory')`)
				if err != nil {
					return
				}
				qs, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				for _, q := range qs {
					lockWaits[q]++
				}
			}
		}()
		migrations := 0
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); migrations++ {
			require.NoError(t, outbox.Migrate(ctx, mpool))
		}
		measuring.Store(false)
		<-watched
		close(stop)
		wg.Wait()
		// A commit waiting for the cluster-wide NOTIFY lock (locktype object) is the
		// notifier of another database committing, not a migration.
		require.Empty(t, lockWaits, "sessions waited on table, row or transaction locks while Migrate ran")
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "all published")
		seen := map[uuid.UUID]int{}
		for _, m := range pub.all() {
			seen[m.ID]++
		}
		require.EqualValues(t, written.Load(), len(seen))
		for id, n := range seen {
			require.Equal(t, 1, n, "message %s published %d times", id, n)
		}
		t.Logf("%d rows added during %d migrations, the slowest Add took %v", measured.Load(), migrations, time.Duration(slowest.Load()))
		// The lock watcher above is the proof that no Add waited on a migration. The slowest
		// Add is only logged: on a busy two-core machine an Add takes a second now and then
		// with no migration at all, so a bound in time would test the machine.
	})

	// A table made before versions were recorded is upgraded while relays and writers run:
	// nothing deadlocks, nothing is lost or published twice.
	t.Run("UpgradeOfAnUnversionedTable", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		v1, err := os.ReadFile("testdata/legacy/001_outbox.sql")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(v1))
		require.NoError(t, err)
		b := &bundle{pool: pool}
		old := b.msg("before-upgrade", 1)
		old.Exchange = "x"
		b.write(t, old)

		pub := &recorder{}
		cfg := quietConfig(t)
		stop := make(chan struct{})
		var written atomic.Int64
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					m := b.msg(fmt.Sprintf("w%d-%d", w, i%5), i)
					m.Exchange = "x"
					if pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, m) }) == nil {
						written.Add(1)
					}
				}
			})
		}
		require.NoError(t, outbox.Migrate(ctx, pool))
		for range 2 {
			b.startRelay(t, pool, pub, cfg)
		}
		require.NoError(t, outbox.Migrate(ctx, pool))
		testinfra.Eventually(t, waitFor, func() bool { return pub.count() > 20 }, "relays publish after the upgrade")
		close(stop)
		wg.Wait()
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "all published")
		seen := map[uuid.UUID]int{}
		for _, m := range pub.all() {
			seen[m.ID]++
		}
		require.EqualValues(t, written.Load()+1, len(seen))
		var versions []int
		rows, err := pool.Query(ctx, "SELECT version FROM outbox_migrations ORDER BY version")
		require.NoError(t, err)
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		require.Equal(t, []int{1, 2, 3}, versions)
	})
}

// The paused relay runs in a child process that stops itself (SIGSTOP) at a crash point with
// its batch claimed, as a process frozen by a debugger, a VM pause or a stuck disk would.
const childPause = "OUTBOXSHOP_TEST_CHILD_PAUSE"

// pausedRelay starts a relay process that claims a batch and then stops; it returns once the
// process is stopped, and kills it when the test ends.
func pausedRelay(t *testing.T, dbURL string, claimTimeout time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childDBEnv+"="+dbURL, childPause+"="+claimTimeout.String(),
		childFailpoint+"="+outbox.FailpointAfterPublish)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "pausing\n", line)
	testinfra.Eventually(t, waitFor, func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			return false
		}
		// The state is the field after the command's name in parentheses; T is stopped.
		_, rest, _ := strings.Cut(string(stat), ") ")
		return strings.HasPrefix(rest, "T")
	}, "child relay stopped")
}

// runPausedChild is the child process of pausedRelay: a relay whose publisher confirms in
// memory and which stops itself once its first batch is confirmed, before marking it.
func runPausedChild(claimTimeout time.Duration) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	r, err := outbox.NewRelay(pool, &recorder{}, outbox.Config{
		BatchSize:      20,
		PublishTimeout: claimTimeout / 2,
		ClaimTimeout:   claimTimeout,
		Hooks: outbox.Hooks{Failpoint: func(hit outbox.FailpointHit) {
			if hit.Name == os.Getenv(childFailpoint) {
				fmt.Println("pausing")
				_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			}
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	_ = r.Run(ctx)
	os.Exit(4)
}

// TestRelayPaused stops a relay mid-batch while another runs: the other publishes the
// stopped relay's rows once PostgreSQL has ended its claim, within ClaimTimeout, in order.
func TestRelayPaused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const claimTimeout = 2 * time.Second
	want := map[string][]uuid.UUID{}
	for a := range 10 {
		agg := fmt.Sprintf("agg-%d", a)
		for i := range 5 {
			want[agg] = append(want[agg], b.write(t, b.msg(agg, i))[0].ID)
		}
	}
	pausedRelay(t, b.pool.Config().ConnString(), claimTimeout)
	held := b.count(t, "published_at IS NULL")
	require.Equal(t, 50, held)

	pub := &recorder{}
	cfg := quietConfig(t)
	start := time.Now()
	b.startRelay(t, b.pool, pub, cfg)
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NULL") == 0 }, "the other relay publishes everything")
	took := time.Since(start)
	t.Logf("rows of the paused relay published after %v (ClaimTimeout %v)", took, claimTimeout)
	require.Less(t, took, claimTimeout+3*time.Second, "released within ClaimTimeout")
	requireAggregateOrder(t, want, pub.all())
}

// TestReleaseNeverWaits: a relay that publishes an aggregate's head does not wait for a lock
// another transaction holds on the next row (another relay's claim that walked past it holds
// it so for a whole batch); it leaves that row to the repair pass, which runs at once.
func TestReleaseNeverWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	rows := b.write(t, b.msg("a", 1), b.msg("a", 2))
	_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET waiting = true WHERE id = $1", rows[1].ID)
	require.NoError(t, err)

	holder, err := b.conn(t).Begin(ctx)
	require.NoError(t, err)
	pub := &recorder{outcome: func(m outbox.Message) error {
		if m.ID == rows[0].ID {
			// While the head is being published, another transaction locks the next row.
			_, err := holder.Exec(ctx, "SELECT 1 FROM outbox_messages WHERE id = $1 FOR UPDATE", rows[1].ID)
			require.NoError(t, err)
		}
		return nil
	}}
	cfg := quietConfig(t)
	cfg.PublishTimeout, cfg.ClaimTimeout = 2*time.Second, 4*time.Second
	r, err := outbox.NewRelay(b.pool, pub, cfg)
	require.NoError(t, err)
	n, err := r.PublishBatch(ctx)
	require.NoError(t, err, "the cycle did not wait for the lock until its statement timeout")
	require.Equal(t, 1, n)
	require.Equal(t, 1, b.count(t, "waiting"), "the locked row was skipped")

	require.NoError(t, holder.Rollback(ctx))
	n, err = r.PublishBatch(ctx) // repairs at once, then claims the row
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireAggregateOrder(t, map[string][]uuid.UUID{"a": ids(rows)}, pub.all())
}

// TestMigrateAfterAnotherTool: a schema made by applying the SQL files of earlier versions
// of this package (testdata/legacy) with another tool, which records no version here, is
// taken over by Migrate.
func TestMigrateAfterAnotherTool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	files, err := filepath.Glob("testdata/legacy/*.sql")
	require.NoError(t, err)
	for _, f := range files {
		sql, err := os.ReadFile(f)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(sql))
		require.NoError(t, err, f)
	}
	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, outbox.Migrate(ctx, pool))
	var versions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_migrations").Scan(&versions))
	all, err := fs.Glob(outbox.Migrations, "migrations/goose/*.sql")
	require.NoError(t, err)
	require.Equal(t, len(all), versions, "the legacy files' versions, and those after them")
}

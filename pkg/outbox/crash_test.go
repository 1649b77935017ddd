package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// The crash test runs a relay in a child process (this test binary, re-executed) that kills
// itself with SIGKILL at a crash point: no deferred code, no rollback sent, as in production.
const (
	childEnv       = "OUTBOXSHOP_TEST_CHILD_RELAY"
	childDBEnv     = "OUTBOXSHOP_TEST_CHILD_DB"
	childAMQPEnv   = "OUTBOXSHOP_TEST_CHILD_AMQP"
	childFailpoint = "OUTBOXSHOP_TEST_CHILD_FAILPOINT"
	childBatchSize = "OUTBOXSHOP_TEST_CHILD_BATCH_SIZE"
	// childWALURL, when set, makes the child a WAL relay reading through that URL.
	childWALURL = "OUTBOXSHOP_TEST_CHILD_WAL_URL"
	// childDeletePublished, when set, makes the child delete the rows it publishes.
	childDeletePublished = "OUTBOXSHOP_TEST_CHILD_DELETE_PUBLISHED"
)

// runChild is the child process: run a relay that dies the first time it reaches the crash
// point named in the environment.
func runChild() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: os.Getenv(childAMQPEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	batchSize := 1000
	if n, err := strconv.Atoi(os.Getenv(childBatchSize)); err == nil {
		batchSize = n
	}
	cfg := outbox.Config{
		BatchSize: batchSize,
		Hooks: outbox.Hooks{Failpoint: func(hit outbox.FailpointHit) {
			if hit.Name == os.Getenv(childFailpoint) {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}},
	}
	cfg.DeletePublished = os.Getenv(childDeletePublished) != ""
	var r interface{ Run(context.Context) error }
	if url := os.Getenv(childWALURL); url != "" {
		r, err = outbox.NewWALRelay(pool, pub, cfg, outbox.WALConfig{URL: url})
	} else {
		r, err = outbox.NewRelay(pool, pub, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	_ = r.Run(ctx)
	os.Exit(4) // Run returned: the crash point was never reached
}

// killedRelay runs a relay process until it kills itself at failpoint.
func killedRelay(t *testing.T, dbURL, amqpURL, failpoint string) {
	t.Helper()
	killedRelayBatching(t, dbURL, amqpURL, failpoint, 1000)
}

// killedRelayBatching is killedRelay with a relay of batchSize rows per batch.
func killedRelayBatching(t *testing.T, dbURL, amqpURL, failpoint string, batchSize int, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childDBEnv+"="+dbURL, childAMQPEnv+"="+amqpURL, childFailpoint+"="+failpoint,
		childBatchSize+"="+strconv.Itoa(batchSize))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "child relay: %v\n%s", err, out)
	status := exit.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL, "child relay did not die at %s: %v\n%s", failpoint, err, out)
}

// TestRelayKilled kills a relay process at each crash point and shows, from the database
// and the broker, what a restarted relay and an inbox consumer make of it.
func TestRelayKilled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		failpoint      string
		wantDuplicates bool // the broker got the batch before the crash
		delete         bool // Config.DeletePublished: the marks delete
	}{
		{outbox.FailpointBeforePublish, false, false},
		{outbox.FailpointAfterPublish, true, false},
		{outbox.FailpointAfterMark, true, false},
		{outbox.FailpointAfterMark, true, true},
	} {
		name := tc.failpoint
		if tc.delete {
			name += "/DeletePublished"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			dbURL := b.pool.Config().ConnString()
			const n = 25
			for i := range n {
				b.write(t, b.msg(fmt.Sprintf("order-%d", i), i))
			}

			cfg := fastConfig(t)
			published := func() bool { return b.count(t, "published_at IS NOT NULL") == n }
			var env []string
			if tc.delete {
				cfg.DeletePublished = true
				published = func() bool { return b.count(t, "true") == 0 } // deleted
				env = append(env, childDeletePublished+"=1")
			}
			killedRelayBatching(t, dbURL, b.amqpURL, tc.failpoint, 1000, env...)
			require.Equal(t, n, b.count(t, "published_at IS NULL"), "the killed relay's transaction rolled back")

			effects := consumeThroughInbox(t, b.pool, b.amqpURL, b.top.Queue)
			b.startRelay(t, b.pool, b.pub, cfg)
			testinfra.Eventually(t, waitFor, published, "all rows published after restart")
			testinfra.Eventually(t, waitFor, func() bool { return effects.applied() == n }, "every effect applied")

			// Each business effect happened exactly once, duplicates or not.
			var rows, maxApplied int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), coalesce(max(applied), 0) FROM test_effects").Scan(&rows, &maxApplied))
			require.Equal(t, n, rows)
			require.Equal(t, 1, maxApplied)
			if tc.wantDuplicates {
				testinfra.Eventually(t, waitFor, func() bool { return effects.duplicates() == n }, "the republished batch arrived as duplicates")
			} else {
				require.Zero(t, effects.duplicates())
			}
		})
	}
}

// inboxEffects is a minimal inbox, kept inside this test so that the package stays copyable:
// the message id is recorded in the same transaction as the business effect.
type inboxEffects struct {
	pool *pgxpool.Pool
}

func (e inboxEffects) applied() int {
	var n int
	_ = e.pool.QueryRow(context.Background(), "SELECT count(*) FROM test_effects").Scan(&n)
	return n
}

func (e inboxEffects) duplicates() int {
	var n int
	_ = e.pool.QueryRow(context.Background(), "SELECT coalesce(sum(duplicates), 0) FROM test_inbox").Scan(&n)
	return n
}

func consumeThroughInbox(t *testing.T, pool *pgxpool.Pool, url, queue string) inboxEffects {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		CREATE TABLE test_inbox (message_id text PRIMARY KEY, duplicates int NOT NULL DEFAULT 0);
		CREATE TABLE test_effects (aggregate_id text PRIMARY KEY, applied int NOT NULL)`)
	require.NoError(t, err)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, "INSERT INTO test_inbox (message_id) VALUES ($1) ON CONFLICT DO NOTHING", d.MessageId)
				if err != nil {
					return err
				}
				if tag.RowsAffected() == 0 {
					_, err := tx.Exec(ctx, "UPDATE test_inbox SET duplicates = duplicates + 1 WHERE message_id = $1", d.MessageId)
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO test_effects (aggregate_id, applied) VALUES ($1, 1)
					ON CONFLICT (aggregate_id) DO UPDATE SET applied = test_effects.applied + 1`, d.Headers["aggregate_id"])
				return err
			})
			if err != nil {
				_ = d.Nack(false, true)
				continue
			}
			_ = d.Ack(false)
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return inboxEffects{pool: pool}
}

// TestRelayKilledWithTwoBatchesInFlight kills a relay that has two batches in flight when its
// first batch is marked, before that batch commits: every row is pending again, and what the
// restarted relay publishes a second time is bounded by the two batches in flight.
func TestRelayKilledWithTwoBatchesInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const n, batch = 60, 10
	for i := range n {
		b.write(t, b.msg(fmt.Sprintf("order-%d", i), i))
	}
	killedRelayBatching(t, b.pool.Config().ConnString(), b.amqpURL, outbox.FailpointAfterMark, batch)
	require.Equal(t, n, b.count(t, "published_at IS NULL"), "no batch of the killed relay committed")

	effects := consumeThroughInbox(t, b.pool, b.amqpURL, b.top.Queue)
	b.startRelay(t, b.pool, b.pub, fastConfig(t))
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "published_at IS NOT NULL") == n }, "all rows published after restart")
	testinfra.Eventually(t, waitFor, func() bool { return effects.applied() == n }, "every effect applied")
	// The first batch was confirmed before the crash; the second may have been.
	testinfra.Eventually(t, waitFor, func() bool { return effects.duplicates() >= batch }, "the confirmed batch arrived again")
	require.LessOrEqual(t, effects.duplicates(), 2*batch, "duplicates are bounded by the batches in flight")
	var maxApplied int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT coalesce(max(applied), 0) FROM test_effects").Scan(&maxApplied))
	require.Equal(t, 1, maxApplied)
}

package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// recordEffect is a handler body: it writes one effects row in the inbox transaction.
func recordEffect(consumer, id string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, message_id) VALUES ($1, $2)`, consumer, id)
		return err
	}
}

func TestProcess(t *testing.T) {
	t.Parallel()

	type bundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) (context.Context, *bundle) {
		t.Helper()
		return t.Context(), &bundle{pool: newMigratedPool(t)}
	}
	effects := func(t *testing.T, b *bundle, id string) int {
		t.Helper()
		return countRows(t, b.pool, `SELECT count(*) FROM effects WHERE message_id = $1`, id)
	}
	inboxRows := func(t *testing.T, b *bundle, id string) int {
		t.Helper()
		return countRows(t, b.pool, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, id)
	}

	t.Run("NewMessageRunsFnAndCommits", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		received := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)

		dup, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1", Type: "order.placed", ReceivedAt: received},
			recordEffect("billing", "m-1"))
		require.NoError(t, err)
		require.False(t, dup)
		require.Equal(t, 1, effects(t, b, "m-1"))

		var (
			msgType              string
			receivedAt, procesAt time.Time
		)
		require.NoError(t, b.pool.QueryRow(ctx,
			`SELECT message_type, received_at, processed_at FROM inbox_messages WHERE consumer = 'billing' AND message_id = 'm-1'`).
			Scan(&msgType, &receivedAt, &procesAt))
		require.Equal(t, "order.placed", msgType)
		require.True(t, received.Equal(receivedAt), "received_at %s, want %s", receivedAt, received)
		require.WithinDuration(t, time.Now(), procesAt, time.Minute)
	})

	t.Run("DuplicateSkipsFn", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msg := inbox.Message{ID: "m-1", Type: "order.placed"}

		dup, err := inbox.Process(ctx, b.pool, "billing", msg, recordEffect("billing", "m-1"))
		require.NoError(t, err)
		require.False(t, dup)

		called := false
		dup, err = inbox.Process(ctx, b.pool, "billing", msg, func(context.Context, pgx.Tx) error {
			called = true
			return nil
		})
		require.NoError(t, err)
		require.True(t, dup)
		require.False(t, called, "fn ran for a duplicate")
		require.Equal(t, 1, effects(t, b, "m-1"))
		require.Equal(t, 1, inboxRows(t, b, "m-1"))
	})

	t.Run("FailingFnRollsBackAndRetrySucceeds", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msg := inbox.Message{ID: "m-1", Type: "order.placed"}
		boom := errors.New("boom")

		dup, err := inbox.Process(ctx, b.pool, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			require.NoError(t, recordEffect("billing", "m-1")(ctx, tx))
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.ErrorContains(t, err, `message "m-1"`)
		require.False(t, dup)
		require.Zero(t, effects(t, b, "m-1"), "the business change was not rolled back")
		require.Zero(t, inboxRows(t, b, "m-1"), "the inbox row was not rolled back")

		dup, err = inbox.Process(ctx, b.pool, "billing", msg, recordEffect("billing", "m-1"))
		require.NoError(t, err)
		require.False(t, dup, "the retry of a failed message must not be a duplicate")
		require.Equal(t, 1, effects(t, b, "m-1"))
	})

	t.Run("PermanentErrorSurvivesWrapping", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		base := errors.New("unknown product")

		_, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1"}, func(context.Context, pgx.Tx) error {
			return fmt.Errorf("reserve stock: %w", inbox.Permanent(base))
		})
		require.True(t, inbox.IsPermanent(err))
		require.ErrorIs(t, err, base)
		require.False(t, inbox.IsPermanent(base))
		require.False(t, inbox.IsPermanent(nil))
		require.NoError(t, inbox.Permanent(nil))
	})

	t.Run("BadInputWritesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		fn := func(context.Context, pgx.Tx) error {
			t.Error("fn called for bad input")
			return nil
		}

		_, err := inbox.Process(ctx, b.pool, "", inbox.Message{ID: "m-1"}, fn)
		require.ErrorIs(t, err, inbox.ErrNoConsumer)
		_, err = inbox.Process(ctx, b.pool, "bill\x00ing", inbox.Message{ID: "m-1"}, fn)
		require.ErrorIs(t, err, inbox.ErrInvalidConsumer)
		for msg, want := range map[inbox.Message]error{
			{ID: ""}:                             inbox.ErrNoMessageID,
			{ID: "m\x001"}:                       inbox.ErrInvalidMessageID,
			{ID: "k\xff\xfe"}:                    inbox.ErrInvalidMessageID,
			{ID: strings.Repeat("m", 256)}:       inbox.ErrInvalidMessageID,
			{ID: "m-1", Type: "order\x00placed"}: inbox.ErrInvalidMessageType,
			{ID: "m-1", Type: "\xc3("}:           inbox.ErrInvalidMessageType,
		} {
			// Refused before a transaction: the begin would fail this test.
			_, err = inbox.Process(ctx, failingBeginner{t}, "billing", msg, fn)
			require.ErrorIs(t, err, want, "%q", msg.ID)
			require.True(t, inbox.IsPermanent(err), "%v", err)
		}
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("FailedBeginIsTransient", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		dbURL := testinfra.DatabaseURL(t)
		proxy := testinfra.NewProxy(t, hostPort(t, dbURL))
		pool, err := pgxpool.New(ctx, proxy.RewriteURL(t, dbURL))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		require.NoError(t, inbox.Migrate(ctx, pool))
		proxy.Cut()

		_, err = inbox.Process(ctx, pool, "billing", inbox.Message{ID: "m-1"}, nil)
		require.ErrorContains(t, err, "begin")
		require.True(t, inbox.IsTransient(err), "%v", err)
	})

	t.Run("FailedInsertIsTransientUnlessTheValueIsBad", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		// No inbox table: not the message's fault, and an operator fixes it.
		pool := testinfra.NewPool(t)
		_, err := inbox.Process(ctx, pool, "billing", inbox.Message{ID: "m-1"}, nil)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42P01", pgErr.Code)
		require.True(t, inbox.IsTransient(err), "%v", err)

		// A LATIN1 database cannot store the euro sign that Validate lets through: the
		// message's fault, for good.
		latin1 := latin1Pool(t)
		require.NoError(t, inbox.Migrate(ctx, latin1))
		_, err = inbox.Process(ctx, latin1, "billing", inbox.Message{ID: "price-in-€"}, nil)
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22P05", pgErr.Code) // untranslatable_character
		require.True(t, inbox.IsPermanent(err), "%v", err)
		_, err = inbox.Process(ctx, latin1, "billing", inbox.Message{ID: "price-in-eur"}, nil)
		require.NoError(t, err)
	})

	t.Run("HandlerAndCommitErrorsAreClassifiedAsTheyAre", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		for code, want := range map[string]inbox.Class{
			"serialization_failure":       inbox.ClassTransient,
			"deadlock_detected":           inbox.ClassTransient,
			"unique_violation":            inbox.ClassFailed,
			"invalid_text_representation": inbox.ClassFailed,
		} {
			_, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-" + code}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = '`+code+`'; END $$`)
				return err
			})
			require.Equal(t, want, inbox.Classify(err), "%s: %v", code, err)
		}
		// A deferred constraint fails the commit: the handler's fault, counted.
		_, err := b.pool.Exec(ctx, `CREATE TABLE reservations (sku text UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		_, err = inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-commit"}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO reservations (sku) VALUES ('a'), ('a')`)
			return err
		})
		require.ErrorContains(t, err, "commit")
		require.Equal(t, inbox.ClassFailed, inbox.Classify(err))
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("TwoConsumersEachProcessOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msg := inbox.Message{ID: "m-1", Type: "order.placed"}

		for _, consumer := range []string{"billing", "shipping"} {
			dup, err := inbox.Process(ctx, b.pool, consumer, msg, recordEffect(consumer, "m-1"))
			require.NoError(t, err)
			require.False(t, dup, consumer)
		}
		for _, consumer := range []string{"billing", "shipping"} {
			dup, err := inbox.Process(ctx, b.pool, consumer, msg, recordEffect(consumer, "m-1"))
			require.NoError(t, err)
			require.True(t, dup, consumer)
		}
		require.Equal(t, 2, effects(t, b, "m-1"))
		require.Equal(t, 1, countRows(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = 'billing'`))
		require.Equal(t, 1, countRows(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = 'shipping'`))
	})

	t.Run("ZeroReceivedAtMeansNow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)

		_, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1"}, nil)
		require.NoError(t, err)
		var receivedAt time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT received_at FROM inbox_messages`).Scan(&receivedAt))
		require.WithinDuration(t, time.Now(), receivedAt, time.Minute)
	})

	t.Run("CommitErrorIsReturned", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		// A deferred unique constraint is checked at commit, so the commit itself fails.
		_, err := b.pool.Exec(ctx, `CREATE TABLE reservations (sku text UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)

		dup, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1"}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO reservations (sku) VALUES ('a'), ('a')`)
			return err
		})
		require.ErrorContains(t, err, "commit")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code)
		require.False(t, dup)
		require.Zero(t, inboxRows(t, b, "m-1"))

		dup, err = inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1"}, nil)
		require.NoError(t, err)
		require.False(t, dup)
	})

	t.Run("WorksWithAConn", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		conn, err := pgx.Connect(ctx, testinfra.DatabaseURL(t))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		require.NoError(t, inbox.Migrate(ctx, conn))

		dup, err := inbox.Process(ctx, conn, "billing", inbox.Message{ID: "m-1"}, nil)
		require.NoError(t, err)
		require.False(t, dup)
		dup, err = inbox.Process(ctx, conn, "billing", inbox.Message{ID: "m-1"}, nil)
		require.NoError(t, err)
		require.True(t, dup)
	})

	t.Run("InsideCallersTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		dup, err := inbox.Process(ctx, tx, "billing", inbox.Message{ID: "m-1"}, recordEffect("billing", "m-1"))
		require.NoError(t, err)
		require.False(t, dup)
		dup, err = inbox.Process(ctx, tx, "billing", inbox.Message{ID: "m-1"}, recordEffect("billing", "m-1"))
		require.NoError(t, err)
		require.True(t, dup)
		require.NoError(t, tx.Rollback(ctx))

		require.Zero(t, inboxRows(t, b, "m-1"), "the caller's rollback must undo the savepoint's work")
		require.Zero(t, effects(t, b, "m-1"))
	})

	t.Run("CancelledContextLeavesNoOpenTransaction", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t)
		ctx, cancel := context.WithCancel(t.Context())

		_, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-1"}, func(ctx context.Context, tx pgx.Tx) error {
			cancel()
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})
		require.ErrorIs(t, err, context.Canceled)

		dup, err := inbox.Process(t.Context(), b.pool, "billing", inbox.Message{ID: "m-1"}, nil)
		require.NoError(t, err)
		require.False(t, dup)
	})
}

// TestProcessConcurrentDeliveries delivers one message 50 times at once. The first
// transaction holds its fn open until every other pooled connection waits on its row lock;
// then they all must see the conflict, and the counter is incremented exactly once.
func TestProcessConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	const (
		deliveries = 50
		maxConns   = 8
	)
	ctx := t.Context()
	dbURL := testinfra.DatabaseURL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, inbox.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, `CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL); INSERT INTO counter VALUES (1, 0)`)
	require.NoError(t, err)

	// A connection outside the pool watches the others wait.
	watcher, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = watcher.Close(context.Background()) })

	var (
		ran, dups atomic.Int64
		entered   = make(chan struct{})
		release   = make(chan struct{})
		unblock   = sync.OnceFunc(func() { close(release) })
		wg        sync.WaitGroup
		start     = make(chan struct{})
		errs      = make(chan error, deliveries)
	)
	for range deliveries {
		wg.Go(func() {
			<-start
			dup, err := inbox.Process(ctx, pool, "stock", inbox.Message{ID: "order-42", Type: "order.placed"},
				func(ctx context.Context, tx pgx.Tx) error {
					if ran.Add(1) == 1 {
						close(entered)
						<-release
					}
					_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
					return err
				})
			if err != nil {
				errs <- err
				return
			}
			if dup {
				dups.Add(1)
			}
		})
	}
	t.Cleanup(unblock) // also when the test fails before releasing
	close(start)
	<-entered
	testinfra.Eventually(t, 30*time.Second, func() bool {
		var waiting int
		err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == maxConns-1
	}, "the other %d pooled transactions never waited on the first one's row lock", maxConns-1)
	unblock()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	require.EqualValues(t, 1, ran.Load(), "fn ran more than once")
	require.EqualValues(t, deliveries-1, dups.Load())
	require.Equal(t, 1, countRows(t, pool, `SELECT n FROM counter WHERE id = 1`))
}

// BenchmarkProcess measures one new message: begin, inbox insert, an empty fn, commit.
func BenchmarkProcess(b *testing.B) {
	pool := testinfra.NewPool(b)
	ctx := b.Context()
	require.NoError(b, inbox.Migrate(ctx, pool))
	fn := func(context.Context, pgx.Tx) error { return nil }
	i := 0
	for b.Loop() {
		i++
		dup, err := inbox.Process(ctx, pool, "bench", inbox.Message{ID: fmt.Sprintf("m-%d", i), Type: "bench"}, fn)
		if err != nil || dup {
			b.Fatalf("process: duplicate=%v err=%v", dup, err)
		}
	}
}

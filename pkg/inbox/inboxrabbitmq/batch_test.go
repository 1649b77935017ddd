package inboxrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// batchCrashChildEnv makes TestBatchCrashChild run: it is the child process of
// TestBatch/CrashMidBatch, which passes the servers and the queue in the variables of
// TestConsumerCrash.
const batchCrashChildEnv = "OUTBOXSHOP_INBOX_BATCH_CRASH_CHILD"

// TestBatch proves the guarantees of batched inbox transactions (BatchSize > 1) and of
// coalesced acknowledgements (AckEvery) against the real broker and database: what goes
// wrong for one message of a batch stays with it, what goes wrong for the transaction costs
// none of them an attempt, and no delivery is acknowledged before its effect is committed,
// nor left unacknowledged after.
func TestBatch(t *testing.T) {
	t.Parallel()

	// Eight messages in one batch: five healthy ones, one whose handler always fails (a
	// counted attempt each time), one it refuses as permanent, and one that fails
	// transiently twice.
	t.Run("OneFailureStaysWithItsMessage", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		calls := newBatchCalls()
		const (
			failing   = "order-fails"
			refused   = "order-refused"
			transient = "order-busy"
		)
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			n, err := calls.addTx(ctx, tx, d)
			if err != nil {
				return err
			}
			switch {
			case d.ID == failing:
				// Its effect is written first: the savepoint must undo it.
				if err := recordEffect(ctx, tx, d); err != nil {
					return err
				}
				return errors.New("warehouse says no")
			case d.ID == refused:
				return inbox.Permanent(errors.New("order.placed version 2 is not supported (1 is)"))
			case d.ID == transient && n <= 2:
				return fmt.Errorf("ask the pricing service: %w", inbox.Transient(errors.New("503 Service Unavailable")))
			}
			return recordEffect(ctx, tx, d)
		}, 8, 8)

		ids := []string{"order-0", failing, "order-1", refused, "order-2", transient, "order-3", "order-4"}
		healthy := []string{"order-0", "order-1", "order-2", "order-3", "order-4"}
		for _, id := range ids {
			b.publish(t, jsonMessage(id))
		}
		stop := b.run(t, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == len(healthy)+1 && len(b.events.deadReasons()) == 2
		}, "the batch's messages did not reach their ends")
		stop()

		calls.requireOneBatch(t, ids...)
		for _, id := range healthy {
			require.Equal(t, []int{1}, calls.attempts(id), "%s: the handler did not run in one delivery", id)
			require.Equal(t, 1, b.effects(t, id), id)
		}
		// The transient failures were retried in place: not counted, no retry copy.
		require.Equal(t, []int{1, 1, 1}, calls.counts(transient))
		require.Equal(t, 1, b.effects(t, transient))
		held := b.logs.find("transient failure; holding the message and retrying in place")
		require.Len(t, held, 1)
		require.Equal(t, transient, held[0].attrs["message_id"])
		// The failing message used up its MaxDeliveries (3) attempts; the refused one got
		// one. Theirs are the only retries and dead letters.
		require.Equal(t, []int{1, 2, 3}, calls.attempts(failing))
		require.Equal(t, []int{1}, calls.attempts(refused))
		require.Zero(t, b.effects(t, failing), "a failed message's write survived its rollback")
		require.Zero(t, b.effects(t, refused))
		require.Equal(t, []int{1, 2}, b.events.retries())
		require.ElementsMatch(t, []string{inboxrabbitmq.ReasonPermanent, inboxrabbitmq.ReasonMaxDeliveries}, b.events.deadReasons())
		dead := b.deadLetters(t, 2)
		require.Equal(t, inboxrabbitmq.ReasonPermanent+": order.placed version 2 is not supported (1 is)", dead[refused])
		require.Equal(t, inboxrabbitmq.ReasonMaxDeliveries+": failed on all 3 attempts; last error: warehouse says no", dead[failing])

		require.Equal(t, len(healthy)+1, countRows(t, b.pool, `SELECT count(*) FROM effects`), "a message was processed twice")
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates)
		require.Empty(t, b.events.handedBack())
		now, _ := b.events.heldNow()
		require.Zero(t, now)
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// A handler that panics for one message of a batch: the others commit, and the
	// panicking one takes the path of a failed attempt, up to the dead-letter queue.
	t.Run("PanicInABatch", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		calls := newBatchCalls()
		const panicking = "order-boom"
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if _, err := calls.addTx(ctx, tx, d); err != nil {
				return err
			}
			if err := recordEffect(ctx, tx, d); err != nil {
				return err
			}
			if d.ID == panicking {
				panic("boom")
			}
			return nil
		}, 4, 8)

		ids := []string{"order-0", panicking, "order-1", "order-2"}
		for _, id := range ids {
			b.publish(t, jsonMessage(id))
		}
		stop := b.run(t, cfg)
		dead := b.getOne(t, b.dead.Queue)
		waitProcessed(t, b, 3)
		stop()

		calls.requireOneBatch(t, ids...)
		for _, id := range []string{"order-0", "order-1", "order-2"} {
			require.Equal(t, []int{1}, calls.attempts(id), id)
			require.Equal(t, 1, b.effects(t, id), id)
		}
		require.Equal(t, panicking, dead.MessageId)
		reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.Equal(t, inboxrabbitmq.ReasonMaxDeliveries+": failed on all 3 attempts; last error: handler panicked: boom", reason)
		require.Equal(t, []int{1, 2, 3}, calls.attempts(panicking))
		require.Zero(t, b.effects(t, panicking), "the panicking message's write survived")
		require.Equal(t, []int{1, 2}, b.events.retries())
		require.Equal(t, []string{inboxrabbitmq.ReasonMaxDeliveries}, b.events.deadReasons())
		errs := b.events.errors()
		require.Len(t, errs, 3)
		for _, err := range errs {
			require.ErrorContains(t, err, "handler panicked: boom")
		}
		require.Len(t, b.logs.find("handler panicked"), len(calls.counts(panicking)), "a panic logged once per call")
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates)
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// One message id twice in a batch, and once more after the consumer that processed it
	// stopped: the handler runs once and every copy is acknowledged.
	t.Run("DuplicateInsideABatch", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		calls := newBatchCalls()
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if _, err := calls.addTx(ctx, tx, d); err != nil {
				return err
			}
			return recordEffect(ctx, tx, d)
		}, 8, 8)

		for _, id := range []string{"order-a", "order-dup", "order-dup", "order-b"} {
			b.publish(t, jsonMessage(id))
		}
		stop := b.run(t, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed == 3 && duplicates == 1
		}, "expected three processed messages and one duplicate")
		stop()
		// The messages around the two copies were in one transaction, and so were they.
		calls.requireOneBatch(t, "order-a", "order-dup", "order-b")
		b.requireQueueEmpty(t, b.top.Queue)

		b.publish(t, jsonMessage("order-dup"))
		stop = b.run(t, cfg)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			_, duplicates := b.events.counts()
			return duplicates == 2
		}, "the third copy was not reported as a duplicate")
		stop()

		require.Equal(t, []int{1}, calls.counts("order-dup"), "the handler ran for a duplicate")
		require.Equal(t, 1, b.effects(t, "order-dup"))
		require.Equal(t, 1, b.effects(t, "order-a"))
		require.Equal(t, 1, b.effects(t, "order-b"))
		processed, duplicates := b.events.counts()
		require.Equal(t, 3, processed)
		require.Equal(t, 2, duplicates)
		skipped := b.logs.find("duplicate message skipped")
		require.Len(t, skipped, 2)
		for _, r := range skipped {
			require.Equal(t, "order-dup", r.attrs["message_id"])
		}
		require.Empty(t, b.events.deadReasons())
		require.Empty(t, b.events.retries())
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// The database goes away in the middle of a batch: its transaction fails, and every
	// message of it is held, uncounted, until the database is back.
	t.Run("DatabaseLostMidBatch", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		pool, proxy := b.proxiedPool(t)
		calls := newBatchCalls()
		var cut sync.Once
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if calls.add(d, 0) == 3 {
				cut.Do(proxy.Cut)
			}
			return recordEffect(ctx, tx, d)
		}, 8, 8)

		const messages = 8
		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		c, stop := b.start(t, pool, cfg)
		// Every message of the batch is held, and retried in place several times.
		testinfra.Eventually(t, 30*time.Second, func() bool {
			now, _ := b.events.heldNow()
			return now == messages && c.Status().Held == messages && len(b.events.errors()) >= 4*messages
		}, "the batch's messages were not held")
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM effects`), "the failed batch committed")
		proxy.Heal()
		waitProcessed(t, b, messages)
		stop()

		for i := range messages {
			id := fmt.Sprintf("order-%d", i)
			require.Equal(t, 1, b.effects(t, id), id)
			for _, d := range calls.deliveries(id) {
				require.Equal(t, 1, d.DeliveryCount, "%s: the outage counted an attempt", id)
				require.False(t, d.Redelivered, "%s: the broker redelivered it", id)
			}
		}
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates)
		require.Empty(t, b.events.retries(), "the outage used up an attempt")
		require.Empty(t, b.events.deadReasons())
		require.Empty(t, b.events.handedBack())
		now, _ := b.events.heldNow()
		require.Zero(t, now)
		deadMessages, _ := b.queueState(t, b.dead.Queue)
		require.Zero(t, deadMessages)
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// A deferred unique constraint that only one message of the batch violates fails the
	// batch's commit. The messages then go on one by one: the culprit alone is charged, and
	// as a 23505 is neither transient nor permanent, it is retried and then dead-lettered.
	t.Run("DeferredConstraintAtCommit", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		_, err := b.pool.Exec(t.Context(), `
			CREATE TABLE claims (
				sku text NOT NULL CONSTRAINT claims_sku_key UNIQUE DEFERRABLE INITIALLY DEFERRED,
				message_id text NOT NULL
			);
			INSERT INTO claims VALUES ('sku-taken', 'an earlier order')`)
		require.NoError(t, err)
		const culprit = "order-culprit"
		calls := newBatchCalls()
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if _, err := calls.addTx(ctx, tx, d); err != nil {
				return err
			}
			sku := "sku-" + d.ID
			if d.ID == culprit {
				sku = "sku-taken" // accepted now, refused at commit
			}
			if _, err := tx.Exec(ctx, `INSERT INTO claims (sku, message_id) VALUES ($1, $2)`, sku, d.ID); err != nil {
				return err
			}
			return recordEffect(ctx, tx, d)
		}, 8, 8)

		innocent := []string{"order-0", "order-1", "order-2", "order-3"}
		ids := []string{"order-0", "order-1", culprit, "order-2", "order-3"}
		for _, id := range ids {
			b.publish(t, jsonMessage(id))
		}
		stop := b.run(t, cfg)
		dead := b.getOne(t, b.dead.Queue)
		waitProcessed(t, b, len(innocent))
		stop()

		calls.requireOneBatch(t, ids...)
		for _, id := range innocent {
			// Once in the batch, rolled back with it, and once alone: uncounted.
			require.Equal(t, []int{1, 1}, calls.counts(id), id)
			require.Equal(t, 1, b.effects(t, id), id)
			require.Equal(t, 1, countRows(t, b.pool, `SELECT count(*) FROM claims WHERE message_id = $1`, id), id)
		}
		require.Equal(t, culprit, dead.MessageId)
		reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.True(t, strings.HasPrefix(reason, inboxrabbitmq.ReasonMaxDeliveries+": failed on all 3 attempts; last error: "), reason)
		require.Contains(t, reason, `duplicate key value violates unique constraint "claims_sku_key" (SQLSTATE 23505)`)
		// The first attempt ran in the batch, whose commit failed uncounted, then alone, whose
		// failed commit counted; each retry copy came alone, a batch of one, whose failed
		// commit is its own and counted at once.
		require.Equal(t, []int{1, 1, 2, 3}, calls.counts(culprit))
		require.Equal(t, []int{1, 2}, b.events.retries(), "only the culprit is charged")
		require.Equal(t, []string{inboxrabbitmq.ReasonMaxDeliveries}, b.events.deadReasons())
		require.Zero(t, b.effects(t, culprit))
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM claims WHERE message_id = $1`, culprit))
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates)
		require.Empty(t, b.events.handedBack())
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// 200 messages through four workers whose batches finish out of order, acknowledged
	// eight at a time with multiple acks: each is processed once and acknowledged, and no
	// ack ever covers a delivery still in hand (the broker would close the channel for
	// acknowledging that delivery a second time).
	t.Run("AcksAreMultipleAndSafe", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		calls := newBatchCalls()
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if _, err := calls.addTx(ctx, tx, d); err != nil {
				return err
			}
			// Uneven work, so that the workers finish their batches out of order.
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			return recordEffect(ctx, tx, d)
		})
		cfg.Prefetch = 32
		cfg.BatchSize = 8
		cfg.AckEvery = 8

		const messages = 200
		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		stop := b.run(t, cfg)
		waitProcessed(t, b, messages)
		b.events.mu.Lock()
		connected := slices.Clone(b.events.connected)
		b.events.mu.Unlock()
		require.Equal(t, []bool{true}, connected, "the consumer lost its channel")
		stop()

		for i := range messages {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
		}
		require.Equal(t, messages, countRows(t, b.pool, `SELECT count(*) FROM effects`))
		_, duplicates := b.events.counts()
		require.Zero(t, duplicates, "a message was redelivered")
		require.Empty(t, b.logs.find("ack failed; the broker will redeliver what it did not acknowledge, and the inbox will skip it"))
		require.Empty(t, b.events.handedBack())
		t.Logf("%d messages in %d transactions", messages, calls.transactions())
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// Fewer processed messages than AckEvery wait for the ack timer; a stop that comes at
	// once still acknowledges them before it closes the channel.
	t.Run("StopFlushesAcks", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		const messages = 3
		cfg := b.batchConfig(recordEffect, 4, 8)
		cfg.AckEvery = 8
		processed := cfg.Hooks.Processed
		var n atomic.Int64
		cfg.Hooks.Processed = func(p inboxrabbitmq.ProcessedMessage) {
			processed(p)
			if n.Add(1) == messages {
				cancel() // the stop begins while the acks wait
			}
		}

		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		c, err := inboxrabbitmq.NewConsumer(b.pool, cfg)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			cancel()
			<-done
			t.Fatal("the consumer did not process the messages and stop")
		}

		require.EqualValues(t, messages, n.Load())
		for i := range messages {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
		}
		require.Empty(t, b.events.handedBack())
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// One slow delivery holds the watermark of the multiple acks: the deliveries after it
	// are acknowledged one by one instead, so the broker goes on delivering past the
	// prefetch while it is in hand, and no ack covers it before it is processed.
	t.Run("SlowMessageDoesNotHoldBackTheOthersAcks", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		const (
			prefetch = 8
			messages = prefetch * 3
			slow     = "order-0" // the first delivery: the lowest delivery tag
			probes   = prefetch - 1
		)
		var (
			release     = make(chan struct{})
			releaseOnce sync.Once
			slowDone    atomic.Bool
		)
		calls := newBatchCalls()
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			calls.add(d, 0)
			if d.ID == slow || strings.HasPrefix(d.ID, "probe-") {
				if d.ID == slow {
					defer slowDone.Store(true)
				}
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return recordEffect(ctx, tx, d)
		})
		cfg.Prefetch = prefetch
		cfg.BatchSize = 1
		cfg.Concurrency = prefetch
		cfg.AckEvery = prefetch
		// Through a proxy, to take the consumer's connection away while the slow delivery
		// is in hand.
		amqpProxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
		cfg.URL = amqpProxy.RewriteURL(t, b.amqpURL)

		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		// A connection for every worker: the blocked handlers hold theirs.
		_, stop := b.start(t, b.sizedPool(t, prefetch), cfg)
		unblock := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unblock) // before the consumer's stop, which would wait for it

		// Without acks above the slow delivery the broker would stop at the prefetch.
		waitProcessed(t, b, messages-1)
		// The slow delivery's worker may reach its handler after the others finished (on a
		// loaded machine it begins its transaction last): in hand either way, unacknowledged.
		testinfra.Eventually(t, 10*time.Second, func() bool { return len(calls.counts(slow)) > 0 },
			"the slow delivery's handler was not called")
		require.False(t, slowDone.Load(), "the slow handler returned")
		require.Equal(t, []int{1}, calls.counts(slow))
		ready, _ := b.queueState(t, b.top.Queue)
		require.Zero(t, ready, "not every message was delivered")

		// Probes that block like the slow one: the broker delivers all of them, the
		// prefetch minus the slow delivery, only once it has the ack of every other message.
		for i := range probes {
			b.publish(t, jsonMessage(fmt.Sprintf("probe-%d", i)))
		}
		testinfra.Eventually(t, 10*time.Second, func() bool {
			for i := range probes {
				if len(calls.deliveries(fmt.Sprintf("probe-%d", i))) == 0 {
					return false
				}
			}
			return true
		}, "the probes were not delivered: the acks of the messages after the slow one were not sent")

		// The connection goes: the broker takes back what is not acknowledged, which is
		// exactly the deliveries in hand.
		amqpProxy.Cut()
		testinfra.Eventually(t, 10*time.Second, func() bool {
			_, consumers := b.queueState(t, b.top.Queue)
			return consumers == 0
		}, "the broker did not notice the lost connection")
		ready, _ = b.queueState(t, b.top.Queue)
		require.Equal(t, 1+probes, ready, "an ack covered a delivery in hand")

		// The blocked handlers commit as the session winds down; their redeliveries on the
		// next connection are duplicates.
		unblock()
		amqpProxy.Heal()
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed == messages+probes && duplicates == 1+probes
		}, "the blocked messages were not processed, or their redeliveries not skipped")
		stop()
		for i := range messages {
			id := fmt.Sprintf("order-%d", i)
			require.Equal(t, []int{1}, calls.counts(id), id)
			require.Equal(t, 1, b.effects(t, id), id)
		}
		for i := range probes {
			id := fmt.Sprintf("probe-%d", i)
			require.Equal(t, []int{1}, calls.counts(id), id)
			require.Equal(t, 1, b.effects(t, id), id)
		}
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// Batches whose handlers update a few hot rows in different orders deadlock, or wait
	// for a lock longer than a batch may. The loser is not charged: every message is
	// applied once, none is retried as a counted attempt or dead-lettered, and the consumer
	// keeps going (its batches shrink after a conflict). So that a conflict happens on any
	// machine, the test itself holds one of the rows for a while at the start: a batch that
	// needs it gives up after its lock timeout, and that message goes on alone.
	t.Run("HotRowsDeadlockNothingCounted", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		ctx := t.Context()
		_, err := b.pool.Exec(ctx, `CREATE TABLE hot (id int PRIMARY KEY, n int NOT NULL);
			INSERT INTO hot SELECT g, 0 FROM generate_series(0, 3) g`)
		require.NoError(t, err)
		const messages = 120
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			var i int
			if _, err := fmt.Sscanf(d.ID, "order-%d", &i); err != nil {
				return inbox.Permanent(err)
			}
			// One hot row per message, as the warehouse's orders on its hot SKUs: messages
			// alone never deadlock, batches of them do.
			if _, err := tx.Exec(ctx, `UPDATE hot SET n = n + 1 WHERE id = $1`, i%4); err != nil {
				return err
			}
			return recordEffect(ctx, tx, d)
		})
		cfg.Prefetch, cfg.BatchSize, cfg.Concurrency = 32, 8, 4
		pool := b.sizedPool(t, 8)
		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
		_, err = holder.Exec(ctx, `SELECT 1 FROM hot WHERE id = 0 FOR UPDATE`)
		require.NoError(t, err)
		_, stop := b.start(t, pool, cfg)
		lockTimedOut := func() bool {
			for _, err := range b.events.errors() {
				if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
					return true
				}
			}
			return false
		}
		testinfra.Eventually(t, 30*time.Second, lockTimedOut, "no batch gave up waiting for the held row")
		require.NoError(t, holder.Commit(ctx))
		testinfra.Eventually(t, time.Minute, func() bool {
			processed, _ := b.events.counts()
			return processed >= messages
		}, "not all processed")
		stop()
		require.Equal(t, messages, countRows(t, b.pool, `SELECT count(*) FROM effects`))
		require.Equal(t, messages, countRows(t, b.pool, `SELECT count(DISTINCT message_id) FROM effects`))
		require.Equal(t, messages, countRows(t, b.pool, `SELECT sum(n)::int FROM hot`))
		require.Empty(t, b.events.retries(), "a lock conflict was charged as an attempt")
		require.Empty(t, b.events.deadReasons())
		for _, err := range b.events.errors() {
			require.True(t, inbox.IsTransient(err), "a lock conflict is transient: %v", err)
		}
	})

	// A consumer in a child process is killed before the commit of its second batch of two:
	// the first batch is committed (its acks, waiting to go out with others, most likely die
	// with the process), the second is not, and nothing uncommitted was acknowledged. A new
	// consumer processes every message exactly once, skipping the committed ones the broker
	// redelivers as duplicates.
	t.Run("CrashMidBatch", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		const messages = 8
		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}

		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBatchCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			batchCrashChildEnv+"=1",
			crashDBEnv+"="+b.dbURL,
			crashAMQPEnv+"="+b.amqpURL,
			crashQueueEnv+"="+b.top.Queue,
			crashDeadEnv+"="+b.dead.Exchange,
		)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		require.True(t, errors.As(err, &exitErr), "child did not fail: %v\n%s", err, out)
		status, ok := exitErr.Sys().(syscall.WaitStatus)
		require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL,
			"child was not killed before its second commit: %v\n%s", err, out)

		// The first batch (order-0 and order-1) is committed, the second is not.
		committed := []string{"order-0", "order-1"}
		for i := range messages {
			id := fmt.Sprintf("order-%d", i)
			require.Equal(t, oneIf(slices.Contains(committed, id)), b.effects(t, id), id)
		}
		require.Equal(t, len(committed), countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		// The broker has back whatever the child did not acknowledge: at least every
		// uncommitted message, and the committed ones too unless their acks went out.
		testinfra.Eventually(t, 10*time.Second, func() bool {
			_, consumers := b.queueState(t, b.top.Queue)
			return consumers == 0
		}, "the broker did not notice the child's death")
		back, _ := b.queueState(t, b.top.Queue)
		require.Contains(t, []int{messages - len(committed), messages}, back, "an uncommitted message was acknowledged")

		calls := newBatchCalls()
		stop := b.run(t, b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			calls.add(d, 0)
			return recordEffect(ctx, tx, d)
		}, 4, 8))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed+duplicates == back
		}, "the redeliveries were not handled")
		stop()

		processed, duplicates := b.events.counts()
		require.Equal(t, messages-len(committed), processed)
		require.Equal(t, back-processed, duplicates)
		for i := range messages {
			id := fmt.Sprintf("order-%d", i)
			require.Equal(t, 1, b.effects(t, id), "%s: not processed exactly once", id)
			if slices.Contains(committed, id) {
				require.Empty(t, calls.deliveries(id), "%s: the handler ran again for a committed message", id)
				continue
			}
			ds := calls.deliveries(id)
			require.Len(t, ds, 1, id)
			require.True(t, ds[0].Redelivered, "%s: the broker's redelivered flag was not set", id)
			require.Equal(t, 1, ds[0].DeliveryCount, "%s: the crash counted an attempt", id)
		}
		require.Empty(t, b.events.deadReasons())
		b.requireQueueEmpty(t, b.top.Queue)
	})

	// A batch bounds its waits for row locks, so that batches that deadlock on hot rows
	// find out in a tenth of a second instead of deadlock_timeout, for all its messages:
	// the rollback to a failed message's savepoint must not undo the bound.
	t.Run("LockTimeoutSurvivesAFailedFirstMessage", func(t *testing.T) {
		t.Parallel()
		b := batchSetup(t)
		calls := newBatchCalls()
		var (
			mu   sync.Mutex
			seen = map[string][]string{} // lock_timeout per call, by message id
		)
		cfg := b.batchConfig(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			n, err := calls.addTx(ctx, tx, d)
			if err != nil {
				return err
			}
			var timeout string
			if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&timeout); err != nil {
				return err
			}
			mu.Lock()
			seen[d.ID] = append(seen[d.ID], timeout)
			mu.Unlock()
			if d.ID == "order-0" && n == 1 {
				return errors.New("warehouse says no") // a counted failure, once
			}
			return recordEffect(ctx, tx, d)
		}, 2, 8)

		for _, id := range []string{"order-0", "order-1"} {
			b.publish(t, jsonMessage(id))
		}
		stop := b.run(t, cfg)
		waitProcessed(t, b, 2)
		stop()
		calls.requireOneBatch(t, "order-0", "order-1")

		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, "100ms", seen["order-0"][0], "the batch's first message runs under the lock timeout")
		require.Equal(t, "100ms", seen["order-1"][0],
			"the second message of the batch ran without the batch's lock timeout, which the first message's rollback undid")
	})
}

// TestBatchCrashChild is the child process of TestBatch/CrashMidBatch; it is skipped in
// normal runs. Its consumer takes batches of two, one at a time, and dies at the third
// handler call: before the commit of its second batch.
func TestBatchCrashChild(t *testing.T) {
	t.Parallel()
	if os.Getenv(batchCrashChildEnv) == "" {
		t.Skip("helper process of TestBatch/CrashMidBatch")
	}
	pool, err := pgxpool.New(context.Background(), os.Getenv(crashDBEnv))
	require.NoError(t, err)
	defer pool.Close()
	var hits atomic.Int64
	c, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                os.Getenv(crashAMQPEnv),
		Queue:              os.Getenv(crashQueueEnv),
		Name:               "orders-projection",
		Handler:            recordEffect,
		DeadLetterExchange: os.Getenv(crashDeadEnv),
		Prefetch:           8,
		Concurrency:        1,
		BatchSize:          2,
		BatchWait:          50 * time.Millisecond,
		Hooks: inboxrabbitmq.Hooks{Failpoint: func(hit inboxrabbitmq.FailpointHit) {
			if hit.Name == inboxrabbitmq.FailpointBeforeCommit && hits.Add(1) == 3 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	t.Fatal("the consumer never reached its third handler call")
}

// batchSetup is setup, with the consumer's log printed when the test fails.
func batchSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	t.Cleanup(func() {
		if t.Failed() {
			b.logs.dump(t)
		}
	})
	return b
}

// batchConfig is b.config with batches of up to size deliveries out of prefetch, taken by
// one worker that waits up to 50ms for a batch to fill: messages published before the
// consumer starts land in one batch.
func (b *bundle) batchConfig(h inboxrabbitmq.Handler, size, prefetch int) inboxrabbitmq.Config {
	cfg := b.config(h)
	cfg.BatchSize = size
	cfg.Prefetch = prefetch
	cfg.Concurrency = 1
	cfg.BatchWait = 50 * time.Millisecond
	return cfg
}

// requireQueueEmpty waits until queue has no consumer, so that the broker has taken back
// every delivery a stopped consumer left unacknowledged, and checks that the queue is
// empty.
func (b *bundle) requireQueueEmpty(t *testing.T, queue string) {
	t.Helper()
	testinfra.Eventually(t, 10*time.Second, func() bool {
		_, consumers := b.queueState(t, queue)
		return consumers == 0
	}, "%s still has a consumer", queue)
	messages, _ := b.queueState(t, queue)
	require.Zero(t, messages, "messages went back to %s: they were not acknowledged", queue)
}

// deadLetters takes n messages from the dead-letter queue and returns their dead reasons
// by message id.
func (b *bundle) deadLetters(t *testing.T, n int) map[string]string {
	t.Helper()
	reasons := map[string]string{}
	for range n {
		d := b.getOne(t, b.dead.Queue)
		reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		reasons[d.MessageId] = reason
	}
	require.Len(t, reasons, n, "a message was dead-lettered twice")
	return reasons
}

// oneIf is 1 for true, 0 for false.
func oneIf(v bool) int {
	if v {
		return 1
	}
	return 0
}

// batchCalls records the handler's calls: the delivery each saw and the id of the
// transaction it ran in.
type batchCalls struct {
	mu    sync.Mutex
	total int
	byID  map[string][]batchCall
}

type batchCall struct {
	d  inboxrabbitmq.Delivery
	tx int64 // txid_current(), or 0 when not asked
}

func newBatchCalls() *batchCalls { return &batchCalls{byID: map[string][]batchCall{}} }

// add records a call in transaction tx and returns how many calls there were in all.
func (c *batchCalls) add(d inboxrabbitmq.Delivery, tx int64) (total int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byID[d.ID] = append(c.byID[d.ID], batchCall{d: d, tx: tx})
	c.total++
	return c.total
}

// addTx records a call with the id of its transaction, and returns how many calls there
// were for its message id.
func (c *batchCalls) addTx(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) (n int, err error) {
	var id int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&id); err != nil {
		return 0, err
	}
	c.add(d, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID[d.ID]), nil
}

// deliveries returns what the calls for id saw.
func (c *batchCalls) deliveries(id string) []inboxrabbitmq.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ds []inboxrabbitmq.Delivery
	for _, call := range c.byID[id] {
		ds = append(ds, call.d)
	}
	return ds
}

// counts returns the DeliveryCount of each call for id, in order.
func (c *batchCalls) counts(id string) []int {
	var counts []int
	for _, d := range c.deliveries(id) {
		counts = append(counts, d.DeliveryCount)
	}
	return counts
}

// attempts returns the DeliveryCount of each delivery of id the handler was called for, in
// order: counts without repeats. A message of a batch in which one failed is called twice
// for one delivery: in the batch's first attempt, rolled back, and in its second, with a
// savepoint per message.
func (c *batchCalls) attempts(id string) []int {
	counts := c.counts(id)
	return slices.Compact(counts)
}

// requireOneBatch checks that ids were handled together: one transaction saw a call for
// each of them (the first attempt at a batch in which one failed, or the second, with a
// savepoint per message).
func (c *batchCalls) requireOneBatch(t *testing.T, ids ...string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[int64]int{} // transaction: how many of ids it handled
	txs := map[string][]int64{}
	for _, id := range ids {
		require.NotEmpty(t, c.byID[id], "no call for %s", id)
		once := map[int64]bool{}
		for _, call := range c.byID[id] {
			if !once[call.tx] {
				once[call.tx] = true
				seen[call.tx]++
				txs[id] = append(txs[id], call.tx)
			}
		}
	}
	for _, n := range seen {
		if n == len(ids) {
			return
		}
	}
	require.Fail(t, "the messages did not land in one batch", "transactions of each: %v", txs)
}

// transactions returns how many transactions the recorded calls ran in.
func (c *batchCalls) transactions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	txs := map[int64]bool{}
	for _, calls := range c.byID {
		for _, call := range calls {
			txs[call.tx] = true
		}
	}
	return len(txs)
}

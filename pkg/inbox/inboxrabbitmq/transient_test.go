package inboxrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestTransientHandlerErrors makes handlers fail transiently more often than MaxDeliveries
// (3 in b.config) allows: each message is retried in place, never counted, and processed
// once.
func TestTransientHandlerErrors(t *testing.T) {
	t.Parallel()

	// failing returns a handler that fails with fail on the first n calls and then records
	// the effect, and the list of deliveries it saw.
	type calls struct {
		mu   sync.Mutex
		seen []inboxrabbitmq.Delivery
	}
	failing := func(n int, fail func(ctx context.Context, tx pgx.Tx) error) (inboxrabbitmq.Handler, *calls) {
		c := &calls{}
		return func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			c.mu.Lock()
			c.seen = append(c.seen, d)
			call := len(c.seen)
			c.mu.Unlock()
			if call <= n {
				return fail(ctx, tx)
			}
			return recordEffect(ctx, tx, d)
		}, c
	}
	raise := func(condition string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'provoked' USING ERRCODE = '`+condition+`'; END $$`)
			return fmt.Errorf("reserve stock: %w", err)
		}
	}

	for _, tc := range []struct {
		name string
		fail func(ctx context.Context, tx pgx.Tx) error
		code string // the SQLSTATE the handler's error carries, if any
	}{
		{"SerializationFailure", raise("serialization_failure"), "40001"},
		{"DeadlockDetected", raise("deadlock_detected"), "40P01"},
		{"LockNotAvailable", raise("lock_not_available"), "55P03"},
		{"MarkedTransient", func(context.Context, pgx.Tx) error {
			return fmt.Errorf("ask the pricing service: %w", inbox.Transient(errors.New("503 Service Unavailable")))
		}, ""},
		{"ConnectionLost", func(ctx context.Context, tx pgx.Tx) error {
			// The server ends this very connection, as a failover or a restart would.
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			if err == nil {
				return errors.New("the connection survived pg_terminate_backend")
			}
			return err
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const failures = 5 // more than MaxDeliveries
			handler, seen := failing(failures, tc.fail)
			b.run(t, b.config(handler))

			b.publish(t, jsonMessage("order-1"))
			testinfra.Eventually(t, 30*time.Second, func() bool {
				processed, _ := b.events.counts()
				return processed == 1
			}, "the message was not processed")

			require.Equal(t, 1, b.effects(t, "order-1"))
			seen.mu.Lock()
			require.Len(t, seen.seen, failures+1)
			for _, d := range seen.seen {
				require.Equal(t, 1, d.DeliveryCount, "a transient failure counted as an attempt")
			}
			seen.mu.Unlock()
			require.Empty(t, b.events.retries())
			require.Empty(t, b.events.deadReasons())
			require.Empty(t, b.events.handedBack())
			errs := b.events.errors()
			require.Len(t, errs, failures)
			for _, err := range errs {
				require.True(t, inbox.IsTransient(err), "%v", err)
				if tc.code != "" {
					var pgErr *pgconn.PgError
					require.ErrorAs(t, err, &pgErr)
					require.Equal(t, tc.code, pgErr.Code)
				}
			}
			require.Len(t, b.logs.find("transient failure; holding the message and retrying in place"), 1)
			require.Len(t, b.logs.find("message processed after transient failures"), 1)
			messages, _ := b.queueState(t, b.top.Queue)
			require.Zero(t, messages)
		})
	}

	// Two messages lock the same two rows in opposite orders: PostgreSQL aborts one of the
	// transactions with a real deadlock_detected, and that message is retried in place.
	t.Run("RealDeadlock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(t.Context(), `CREATE TABLE stock (sku text PRIMARY KEY); INSERT INTO stock VALUES ('a'), ('b')`)
		require.NoError(t, err)
		var (
			mu      sync.Mutex
			calls   = map[string][]int{}
			locked  sync.WaitGroup // both first attempts hold their first row
			orderOf = map[string][2]string{"order-ab": {"a", "b"}, "order-ba": {"b", "a"}}
			// bothHeld is closed once an attempt holds both rows: the deadlock's survivor.
			bothHeld     = make(chan struct{})
			bothHeldOnce sync.Once
		)
		locked.Add(2)
		lock := func(ctx context.Context, tx pgx.Tx, sku string) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM stock WHERE sku = $1 FOR UPDATE`, sku)
			return err
		}
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			mu.Lock()
			calls[d.ID] = append(calls[d.ID], d.DeliveryCount)
			first := len(calls[d.ID]) == 1
			mu.Unlock()
			order := orderOf[d.ID]
			if !first {
				// The victim's retry in place waits for the survivor to hold both rows. On a
				// loaded machine it could otherwise take its first row before the survivor,
				// woken by the victim's rollback, takes it, and deadlock with it again.
				select {
				case <-bothHeld:
				case <-time.After(20 * time.Second):
					t.Error("the deadlock's survivor never held both rows")
				}
			}
			if err := lock(ctx, tx, order[0]); err != nil {
				return err
			}
			if first {
				locked.Done()
				waitGroup(t, &locked, 20*time.Second)
			}
			if err := lock(ctx, tx, order[1]); err != nil {
				return fmt.Errorf("lock %s: %w", order[1], err)
			}
			bothHeldOnce.Do(func() { close(bothHeld) })
			return recordEffect(ctx, tx, d)
		})
		// A transaction per message, for a deadlock PostgreSQL detects: a batch bounds its
		// lock waits (both would time out instead), which TestBatch's
		// HotRowsDeadlockNothingCounted proves.
		cfg.BatchSize = 1
		b.run(t, cfg)

		b.publish(t, jsonMessage("order-ab"))
		b.publish(t, jsonMessage("order-ba"))
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 2
		}, "the two messages were not processed")

		require.Equal(t, 1, b.effects(t, "order-ab"))
		require.Equal(t, 1, b.effects(t, "order-ba"))
		errs := b.events.errors()
		require.Len(t, errs, 1, "exactly one transaction is the deadlock's victim")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, errs[0], &pgErr)
		require.Equal(t, "40P01", pgErr.Code)
		mu.Lock()
		require.Equal(t, 3, len(calls["order-ab"])+len(calls["order-ba"]))
		for id, counts := range calls {
			for _, n := range counts {
				require.Equal(t, 1, n, "%s: the deadlock counted as an attempt", id)
			}
		}
		mu.Unlock()
		require.Empty(t, b.events.retries())
		require.Empty(t, b.events.deadReasons())
	})

	// A handler error that is not transient still counts: a constraint violation ends in
	// the dead-letter queue after MaxDeliveries.
	t.Run("ConstraintViolationCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		handler, seen := failing(1000, raise("unique_violation"))
		b.run(t, b.config(handler))

		b.publish(t, jsonMessage("order-1"))
		dead := b.getOne(t, b.dead.Queue)
		reason, _ := dead.Headers[inboxrabbitmq.HeaderDeadReason].(string)
		require.Contains(t, reason, inboxrabbitmq.ReasonMaxDeliveries+": failed on all 3 attempts; last error: reserve stock: ERROR: provoked (SQLSTATE 23505)")
		seen.mu.Lock()
		require.Len(t, seen.seen, 3)
		seen.mu.Unlock()
		require.Equal(t, []int{1, 2}, b.events.retries())
	})
}

// waitGroup waits for wg, failing the test after timeout.
func waitGroup(t *testing.T, wg *sync.WaitGroup, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Error("the other handler never arrived")
	}
}

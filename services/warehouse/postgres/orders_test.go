package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

func TestReserve(t *testing.T) {
	t.Parallel()

	t.Run("reserves every line, down to exactly zero", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setStock(t, map[string]int64{"A": 5, "B": 3})
		id := newOrderID()
		d := b.reserve(t, id, []warehouse.Line{{SKU: "B", Quantity: 3}, {SKU: "A", Quantity: 5}})
		require.Equal(t, warehouse.ActionReserve, d.Action)
		require.Zero(t, b.available(t, "A"))
		require.Zero(t, b.available(t, "B"))
		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusReserved, r.Status)
		require.Equal(t, []warehouse.Line{{SKU: "A", Quantity: 5}, {SKU: "B", Quantity: 3}}, r.Lines)
		require.Equal(t, map[string]int{"reserve": 2}, b.movements(t, id))
		item, err := b.store.GetStock(context.Background(), "A")
		require.NoError(t, err)
		require.Equal(t, int64(5), item.Reserved)
		b.requireConsistent(t)
	})

	t.Run("one short line reserves nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setStock(t, map[string]int64{"A": 5, "B": 2})
		before, err := b.store.GetStock(context.Background(), "A")
		require.NoError(t, err)
		id := newOrderID()
		d := b.reserve(t, id, []warehouse.Line{{SKU: "A", Quantity: 5}, {SKU: "B", Quantity: 3}})
		require.Equal(t, warehouse.ActionReject, d.Action)
		require.Equal(t, warehouse.ReasonInsufficientStock, d.Reason)
		require.Equal(t, []warehouse.Shortage{{SKU: "B", Requested: 3, Available: 2}}, d.Shortages)
		require.Equal(t, int64(5), b.available(t, "A"))
		require.Equal(t, int64(2), b.available(t, "B"))
		after, err := b.store.GetStock(context.Background(), "A")
		require.NoError(t, err)
		require.Equal(t, before.Version, after.Version, "A, taken before B was found short, is rolled back, not given back: its version (ETag) is unchanged")
		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusRejected, r.Status)
		require.Equal(t, warehouse.ReasonInsufficientStock, r.Reason)
		require.Empty(t, b.movements(t, id))
		b.requireConsistent(t)
	})

	t.Run("an unknown SKU is rejected and nothing is held", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		d := b.reserve(t, id, []warehouse.Line{{SKU: "BOOK-1", Quantity: 1}, {SKU: "NOPE", Quantity: 1}})
		require.Equal(t, warehouse.ActionReject, d.Action)
		require.Equal(t, warehouse.ReasonUnknownSKU, d.Reason)
		require.Equal(t, []warehouse.Shortage{{SKU: "NOPE", Requested: 1, Available: 0}}, d.Shortages)
		require.Equal(t, int64(100), b.available(t, "BOOK-1"))
		require.Equal(t, warehouse.StatusRejected, b.reservation(t, id).Status)
		b.requireConsistent(t)
	})

	t.Run("a second OrderCreated for a decided order changes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		require.Equal(t, warehouse.ActionReserve, b.reserve(t, id, []warehouse.Line{{SKU: "BAG-1", Quantity: 4}}).Action)
		d := b.reserve(t, id, []warehouse.Line{{SKU: "BAG-1", Quantity: 4}})
		require.Equal(t, warehouse.ActionIgnore, d.Action)
		require.Equal(t, int64(6), b.available(t, "BAG-1"))
		require.Equal(t, map[string]int{"reserve": 1}, b.movements(t, id))
		b.requireConsistent(t)
	})

	t.Run("a second OrderCreated of several lines changes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		lines := []warehouse.Line{{SKU: "BAG-1", Quantity: 4}, {SKU: "PEN-1", Quantity: 1}}
		require.Equal(t, warehouse.ActionReserve, b.reserve(t, id, lines).Action)
		before := map[string]int64{"BAG-1": b.available(t, "BAG-1"), "PEN-1": b.available(t, "PEN-1")}
		require.Equal(t, warehouse.ActionIgnore, b.reserve(t, id, lines).Action)
		require.Equal(t, before, map[string]int64{"BAG-1": b.available(t, "BAG-1"), "PEN-1": b.available(t, "PEN-1")})
		require.Equal(t, map[string]int{"reserve": 2}, b.movements(t, id))
		b.requireConsistent(t)
	})

	// The copies of one order's event race: the order's lock lets one through at a time, and
	// the stock each later copy would take sees the reservation the first committed (every
	// statement of the round trip that takes stock reads after the lock was granted). The
	// test holds the order's lock until every copy waits for it, its stock statements
	// already sent.
	t.Run("copies of one order at once take its stock once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		b := setup(t)
		id := newOrderID()
		lines := []warehouse.Line{{SKU: "BAG-1", Quantity: 1}, {SKU: "PEN-1", Quantity: 2}}
		bag, pen := b.available(t, "BAG-1"), b.available(t, "PEN-1")
		const copies = 8
		cfg := b.pool.Config()
		cfg.MaxConns = copies + 2 // the copies, the holder, the check
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		holder, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		const orderLockClass = 0x57484f55 // lockOrderSQL's first key
		_, err = holder.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", int32(orderLockClass), id.String())
		require.NoError(t, err)

		var (
			wg      sync.WaitGroup
			actions = make(chan warehouse.Action, copies)
		)
		for i := range copies {
			wg.Go(func() {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					d, err := postgres.Reserve(ctx, tx, id, lines, fmt.Sprint("copy-", i), time.Now())
					actions <- d.Action
					return err
				})
				assert.NoError(t, err) // not require: this is not the test's goroutine
			})
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			var waiting int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::bigint = $1",
				int64(orderLockClass)).Scan(&waiting)
			return err == nil && waiting == copies
		}, "the copies did not all wait for the order's lock")
		require.NoError(t, holder.Commit(ctx))
		wg.Wait()
		close(actions)
		count := map[warehouse.Action]int{}
		for a := range actions {
			count[a]++
		}
		require.Equal(t, map[warehouse.Action]int{warehouse.ActionReserve: 1, warehouse.ActionIgnore: copies - 1}, count)
		require.Equal(t, bag-1, b.available(t, "BAG-1"))
		require.Equal(t, pen-2, b.available(t, "PEN-1"))
		b.requireConsistent(t)
	})

	t.Run("concurrent orders never oversell and never deadlock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setStock(t, map[string]int64{"A": 10, "B": 10, "C": 10})
		// Every order takes one of each of two SKUs, in both orders of naming them: without
		// the sorted locking these would deadlock.
		pairs := [][2]string{{"A", "B"}, {"B", "A"}, {"B", "C"}, {"C", "B"}, {"A", "C"}, {"C", "A"}}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			reserved int
		)
		for i := range 30 {
			wg.Go(func() {
				p := pairs[i%len(pairs)]
				id := newOrderID()
				err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
					d, err := postgres.Reserve(context.Background(), tx, id,
						warehouse.MergeLines([]warehouse.Line{{SKU: p[0], Quantity: 1}, {SKU: p[1], Quantity: 1}}), fmt.Sprint(i), time.Now())
					if err == nil && d.Action == warehouse.ActionReserve {
						mu.Lock()
						reserved++
						mu.Unlock()
					}
					return err
				})
				assert.NoError(t, err) // not require: this is not the test's goroutine
			})
		}
		wg.Wait()
		// How many fit depends on the order they came in (ten A+B orders first leave C
		// unusable), but every unit is either available or held by exactly one order.
		var left int64
		for _, sku := range []string{"A", "B", "C"} {
			n := b.available(t, sku)
			require.GreaterOrEqual(t, n, int64(0))
			left += n
		}
		require.Equal(t, int64(30-2*reserved), left)
		require.GreaterOrEqual(t, reserved, 10)
		b.requireConsistent(t)
	})
}

func TestReserveHotSKU(t *testing.T) {
	t.Parallel()
	// Concurrent one-line orders of one SKU queue on its row lock inside the conditional
	// UPDATE, which re-reads the level once the holder commits: exactly the stock is
	// reserved, and every other order is rejected with the level it found.
	b := setup(t)
	b.setStock(t, map[string]int64{"HOT": 10})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		decision = map[warehouse.Action]int{}
	)
	for i := range 25 {
		wg.Go(func() {
			err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
				d, err := postgres.Reserve(context.Background(), tx, newOrderID(), []warehouse.Line{{SKU: "HOT", Quantity: 1}}, fmt.Sprint(i), time.Now())
				if err != nil {
					return err
				}
				if d.Action == warehouse.ActionReject && (d.Reason != warehouse.ReasonInsufficientStock || len(d.Shortages) != 1 || d.Shortages[0].Available != 0) {
					return fmt.Errorf("rejected with %+v", d)
				}
				mu.Lock()
				decision[d.Action]++
				mu.Unlock()
				return nil
			})
			assert.NoError(t, err) // not require: this is not the test's goroutine
		})
	}
	wg.Wait()
	require.Equal(t, map[warehouse.Action]int{warehouse.ActionReserve: 10, warehouse.ActionReject: 15}, decision)
	require.Zero(t, b.available(t, "HOT"))
	b.requireConsistent(t)
}

func TestRelease(t *testing.T) {
	t.Parallel()

	t.Run("gives a reservation back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		b.reserve(t, id, []warehouse.Line{{SKU: "MUG-1", Quantity: 20}, {SKU: "PEN-1", Quantity: 1}})
		require.Equal(t, int64(30), b.available(t, "MUG-1"))
		d, lines := b.release(t, id, "c1")
		require.Equal(t, warehouse.ActionRelease, d.Action)
		require.Equal(t, []warehouse.Line{{SKU: "MUG-1", Quantity: 20}, {SKU: "PEN-1", Quantity: 1}}, lines)
		require.Equal(t, int64(50), b.available(t, "MUG-1"))
		require.Equal(t, int64(200), b.available(t, "PEN-1"))
		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusReleased, r.Status)
		require.Equal(t, "c1", r.CancelledMessageID)
		require.Equal(t, map[string]int{"reserve": 2, "release": 2}, b.movements(t, id))
		b.requireConsistent(t)

		t.Run("and a second cancellation changes nothing", func(t *testing.T) {
			d, lines := b.release(t, id, "c2")
			require.Equal(t, warehouse.ActionIgnore, d.Action)
			require.Empty(t, lines)
			require.Equal(t, int64(50), b.available(t, "MUG-1"))
			require.Equal(t, "c1", b.reservation(t, id).CancelledMessageID)
			b.requireConsistent(t)
		})
	})

	t.Run("before its order leaves a tombstone, and the late order reserves nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		d, lines := b.release(t, id, "c1")
		require.Equal(t, warehouse.ActionTombstone, d.Action)
		require.Empty(t, lines)
		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusCancelled, r.Status)
		require.Empty(t, r.Lines)

		d = b.reserve(t, id, []warehouse.Line{{SKU: "TEE-1", Quantity: 3}})
		require.Equal(t, warehouse.ActionReject, d.Action)
		require.Equal(t, warehouse.ReasonOrderCancelled, d.Reason)
		require.Equal(t, int64(30), b.available(t, "TEE-1"))
		r = b.reservation(t, id)
		require.Equal(t, warehouse.StatusCancelled, r.Status)
		require.Equal(t, []warehouse.Line{{SKU: "TEE-1", Quantity: 3}}, r.Lines)
		require.Empty(t, b.movements(t, id))

		require.Equal(t, warehouse.ActionIgnore, b.reserve(t, id, []warehouse.Line{{SKU: "TEE-1", Quantity: 3}}).Action)
		d, _ = b.release(t, id, "c2")
		require.Equal(t, warehouse.ActionIgnore, d.Action)
		b.requireConsistent(t)
	})

	t.Run("before its order of several lines, and the late order takes none of them", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		d, _ := b.release(t, id, "c1")
		require.Equal(t, warehouse.ActionTombstone, d.Action)
		tee, bag := b.available(t, "TEE-1"), b.available(t, "BAG-1")
		// In one transaction, as in an inbox batch: the late order, then a new one, which
		// reserves after the savepoint the late order left behind.
		other := newOrderID()
		var late, next warehouse.Decision
		require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
			var err error
			late, err = postgres.Reserve(context.Background(), tx, id, []warehouse.Line{{SKU: "BAG-1", Quantity: 1}, {SKU: "TEE-1", Quantity: 3}}, "m1", time.Now())
			if err != nil {
				return err
			}
			next, err = postgres.Reserve(context.Background(), tx, other, []warehouse.Line{{SKU: "BAG-1", Quantity: 1}, {SKU: "TEE-1", Quantity: 1}}, "m2", time.Now())
			return err
		}))
		require.Equal(t, warehouse.ActionReject, late.Action)
		require.Equal(t, warehouse.ReasonOrderCancelled, late.Reason)
		require.Empty(t, b.movements(t, id))
		require.Len(t, b.reservation(t, id).Lines, 2)
		require.Equal(t, warehouse.ActionReserve, next.Action)
		require.Equal(t, tee-1, b.available(t, "TEE-1"), "only the new order's line")
		require.Equal(t, bag-1, b.available(t, "BAG-1"))
		b.requireConsistent(t)
	})

	t.Run("of a rejected order is acknowledged once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := newOrderID()
		b.reserve(t, id, []warehouse.Line{{SKU: "BAG-1", Quantity: 11}})
		d, lines := b.release(t, id, "c1")
		require.Equal(t, warehouse.ActionAcknowledgeCancel, d.Action)
		require.Empty(t, lines)
		r := b.reservation(t, id)
		require.Equal(t, warehouse.StatusRejected, r.Status)
		require.Equal(t, warehouse.ReasonInsufficientStock, r.Reason)
		require.Equal(t, int64(10), b.available(t, "BAG-1"))
		d, _ = b.release(t, id, "c2")
		require.Equal(t, warehouse.ActionIgnore, d.Action)
		b.requireConsistent(t)
	})

	t.Run("racing its own order ends with nothing held", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 10 {
			id := newOrderID()
			var wg sync.WaitGroup
			wg.Go(func() {
				assert.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
					_, err := postgres.Reserve(context.Background(), tx, id, []warehouse.Line{{SKU: "PEN-1", Quantity: 1}}, "m-"+id.String(), time.Now())
					return err
				}))
			})
			wg.Go(func() {
				assert.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
					_, _, err := postgres.Release(context.Background(), tx, id, "c-"+id.String(), time.Now())
					return err
				}))
			})
			wg.Wait()
			require.False(t, b.reservation(t, id).Status.Holds())
		}
		require.Equal(t, int64(200), b.available(t, "PEN-1"))
		b.requireConsistent(t)
	})
}

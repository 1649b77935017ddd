package postgres_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

func TestStore(t *testing.T) {
	t.Parallel()

	t.Run("Available reads the stock of the SKUs asked for that exist", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setStock(t, map[string]int64{"NEW-1": 7})
		got, err := b.store.Available(context.Background(), []string{"BOOK-1", "BAG-1", "NOPE-1"})
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"BOOK-1": 100, "BAG-1": 10}, got)
	})

	t.Run("SetStock creates a SKU named after itself, then updates it with a ledger row each", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		item, created, err := b.store.SetStock(ctx, "NEW-1", "", 12)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, "NEW-1", item.Name)
		require.Equal(t, int64(12), item.Available)

		item, created, err = b.store.SetStock(ctx, "NEW-1", "New thing", 4)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, "New thing", item.Name)
		require.Equal(t, int64(4), item.Available)

		item, _, err = b.store.SetStock(ctx, "NEW-1", "", 4)
		require.NoError(t, err)
		require.Equal(t, "New thing", item.Name, "no name keeps the name")

		var deltas []int64
		rows, err := b.pool.Query(ctx, `SELECT delta FROM stock_movements WHERE sku = 'NEW-1' AND kind = 'set' ORDER BY id`)
		require.NoError(t, err)
		for rows.Next() {
			var d int64
			require.NoError(t, rows.Scan(&d))
			deltas = append(deltas, d)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []int64{12, -8, 0}, deltas)
		b.requireConsistent(t)
	})

	t.Run("SetStock of one new SKU from many requests at once creates it once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		done := make(chan bool, 8)
		for i := range 8 {
			go func() {
				_, created, err := b.store.SetStock(context.Background(), "RACE-1", "", int64(i))
				assert.NoError(t, err)
				done <- created
			}()
		}
		var created int
		for range 8 {
			if <-done {
				created++
			}
		}
		require.Equal(t, 1, created)
		b.requireConsistent(t)
	})

	t.Run("unknown SKU and reservation are not found", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.GetStock(context.Background(), "NOPE")
		require.Equal(t, warehouse.CodeNotFound, warehouse.ErrorCode(err))
		_, err = b.store.GetReservation(context.Background(), newOrderID())
		require.Equal(t, warehouse.CodeNotFound, warehouse.ErrorCode(err))
	})

	t.Run("Verify finds stock changed behind the ledger's back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(context.Background(), `UPDATE stock SET available = available + 1 WHERE sku = 'MUG-1'`)
		require.NoError(t, err)
		id := newOrderID()
		b.reserve(t, id, []warehouse.Line{{SKU: "PEN-1", Quantity: 2}})
		_, err = b.pool.Exec(context.Background(), `UPDATE reservations SET status = 'REJECTED' WHERE order_id = $1`, id)
		require.NoError(t, err)
		problems, err := postgres.Verify(context.Background(), b.pool)
		require.NoError(t, err)
		require.Len(t, problems, 2)
		require.Contains(t, problems[0], "MUG-1: available 51, ledger 50")
		require.Contains(t, problems[1], id.String())
	})
}

func TestSeed(t *testing.T) {
	t.Parallel()

	t.Run("resets the catalogue and leaves other SKUs alone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.setStock(t, map[string]int64{"BOOK-1": 3, "OTHER-1": 9})
		_, err := b.pool.Exec(ctx, `DELETE FROM stock_movements WHERE sku = 'BAG-1'; DELETE FROM stock WHERE sku = 'BAG-1'`)
		require.NoError(t, err)
		_, _, err = b.store.SetStock(ctx, "MUG-1", "Renamed", 50)
		require.NoError(t, err)

		changes, err := b.store.Seed(ctx, false)
		require.NoError(t, err)
		require.ElementsMatch(t, []postgres.SeedChange{{SKU: "BAG-1", From: 0, To: 10}, {SKU: "BOOK-1", From: 3, To: 100}}, changes)
		for _, c := range warehouse.Catalogue {
			item, err := b.store.GetStock(ctx, c.SKU)
			require.NoError(t, err)
			require.Equal(t, c.Available, item.Available)
			require.Equal(t, c.Name, item.Name)
		}
		require.Equal(t, int64(9), b.available(t, "OTHER-1"))
		b.requireConsistent(t)
	})

	t.Run("refuses while reservations hold stock, unless forced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		id := newOrderID()
		b.reserve(t, id, []warehouse.Line{{SKU: "TEE-1", Quantity: 10}})
		_, err := b.store.Seed(ctx, false)
		require.Equal(t, warehouse.CodeConflict, warehouse.ErrorCode(err))
		require.Equal(t, int64(20), b.available(t, "TEE-1"))

		changes, err := b.store.Seed(ctx, true)
		require.NoError(t, err)
		require.Equal(t, []postgres.SeedChange{{SKU: "TEE-1", From: 20, To: 30}}, changes)
		require.Equal(t, int64(30), b.available(t, "TEE-1"))
		b.requireConsistent(t)
	})
}

func TestListStock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var all []string
	for after := ""; ; {
		page, err := b.store.ListStock(ctx, after, 2)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 2)
		if len(page) == 0 {
			break
		}
		for _, i := range page {
			all = append(all, i.SKU)
			require.Positive(t, i.Version)
		}
		after = page[len(page)-1].SKU
	}
	require.Equal(t, []string{"BAG-1", "BOOK-1", "MUG-1", "PEN-1", "TEE-1"}, all, "every SKU once, in SKU order")
}

// TestSetStockIf checks the preconditions of a conditional write, and that a reservation
// made after a read makes a write based on that read fail, with nothing written.
func TestSetStockIf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	failed := func(t *testing.T, err error) {
		t.Helper()
		require.Equal(t, warehouse.CodePreconditionFailed, warehouse.ErrorCode(err), "%v", err)
	}

	t.Run("If-Match: a version read before a reservation no longer matches", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		read, err := b.store.GetStock(ctx, "BOOK-1")
		require.NoError(t, err)
		b.reserve(t, uuid.Must(uuid.NewV7()), []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}})
		_, _, err = b.store.SetStockIf(ctx, "BOOK-1", "", 500, warehouse.Precondition{Versions: []int64{read.Version}})
		failed(t, err)
		require.Equal(t, int64(98), b.available(t, "BOOK-1"), "the reservation stands")

		now, err := b.store.GetStock(ctx, "BOOK-1")
		require.NoError(t, err)
		require.Greater(t, now.Version, read.Version)
		item, created, err := b.store.SetStockIf(ctx, "BOOK-1", "", 500, warehouse.Precondition{Versions: []int64{1, now.Version}})
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, int64(500), item.Available)
		require.Greater(t, item.Version, now.Version)
		b.requireConsistent(t)
	})

	t.Run("If-Match: * needs the SKU to exist", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, err := b.store.SetStockIf(ctx, "NEW-1", "", 5, warehouse.Precondition{Exists: true})
		failed(t, err)
		_, _, err = b.store.SetStockIf(ctx, "NEW-1", "", 5, warehouse.Precondition{Versions: []int64{1}})
		failed(t, err)
		_, err = b.store.GetStock(ctx, "NEW-1")
		require.Equal(t, warehouse.CodeNotFound, warehouse.ErrorCode(err), "nothing created")
		_, _, err = b.store.SetStockIf(ctx, "BOOK-1", "", 5, warehouse.Precondition{Exists: true})
		require.NoError(t, err)
	})

	t.Run("If-None-Match: * creates, and only creates", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, created, err := b.store.SetStockIf(ctx, "NEW-1", "New", 5, warehouse.Precondition{Absent: true})
		require.NoError(t, err)
		require.True(t, created)
		_, _, err = b.store.SetStockIf(ctx, "NEW-1", "New", 9, warehouse.Precondition{Absent: true})
		failed(t, err)
		require.Equal(t, int64(5), b.available(t, "NEW-1"))
		b.requireConsistent(t)
	})
}

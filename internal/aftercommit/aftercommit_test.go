package aftercommit_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestRegister(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	db := aftercommit.Wrap(pool)

	t.Run("TellsThePoolSize", func(t *testing.T) {
		stat, ok := db.(interface{ Stat() *pgxpool.Stat })
		if !ok {
			t.Fatal("the wrapped pool hides its Stat, which the consumer reads its size from")
		}
		if got, want := stat.Stat().MaxConns(), pool.Stat().MaxConns(); got != want {
			t.Fatalf("MaxConns %d, want the pool's %d", got, want)
		}
		if _, ok := aftercommit.Wrap(aftercommit.Wrap(nil)).(interface{ Stat() *pgxpool.Stat }); ok {
			t.Fatal("a Beginner without Stat got one")
		}
	})

	t.Run("RunsAfterCommitInOrder", func(t *testing.T) {
		t.Parallel()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for i := range 3 {
			if !aftercommit.Register(tx, func() { got = append(got, i) }) {
				t.Fatal("Register refused a wrapped transaction")
			}
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Fatalf("ran before the commit: %v", got)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || got[0] != 0 || got[2] != 2 {
			t.Fatalf("got %v, want [0 1 2]", got)
		}
	})

	t.Run("NotAfterRollback", func(t *testing.T) {
		t.Parallel()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		aftercommit.Register(tx, func() { ran = true })
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit after rollback succeeded")
		}
		if ran {
			t.Fatal("ran after a rollback")
		}
	})

	t.Run("NotWhenCommitFails", func(t *testing.T) {
		t.Parallel()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		aftercommit.Register(tx, func() { ran = true })
		if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
			t.Fatal("division by zero succeeded")
		}
		// pgx answers the commit of a failed transaction with ErrTxCommitRollback.
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit of a failed transaction succeeded")
		}
		if ran {
			t.Fatal("ran although the transaction rolled back")
		}
	})

	t.Run("RefusesOtherTransactions", func(t *testing.T) {
		t.Parallel()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // test clean-up
		if aftercommit.Register(tx, func() {}) {
			t.Fatal("Register accepted a transaction that was not wrapped")
		}
	})
}

// Package aftercommit lets code inside a transaction run something once that transaction has
// committed, and only then: a metric of an effect that must not be counted when the effect
// rolled back.
//
// Wrap the pool a consumer begins its transactions on; code handed such a transaction
// registers a function with [Register]:
//
//	consumer, err := inboxrabbitmq.NewConsumer(aftercommit.Wrap(pool), cfg)
//
//	// in the handler, inside the inbox transaction tx:
//	aftercommit.Register(tx, func() { reserved.Inc() })
//
// The functions run in the goroutine that called Commit, after Commit succeeded, in the order
// they were registered. After a rollback, or a Commit that returned an error, they never run.
// (A Commit whose answer was lost may have committed all the same: then the effect is not
// counted. Counting it twice is the worse error.)
package aftercommit

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Beginner starts a transaction. *pgxpool.Pool and *pgx.Conn implement it, and so does
// pkg/inbox's TxBeginner interface.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Wrap returns a Beginner whose transactions run the functions registered on them with
// [Register] after they committed. When db tells its pool's size (Stat, as *pgxpool.Pool
// does), so does the Beginner returned, so that the consumer can still check its pool.
func Wrap(db Beginner) Beginner {
	if s, ok := db.(stater); ok {
		return statBeginner{beginner{db}, s}
	}
	return beginner{db}
}

type beginner struct{ db Beginner }

type stater interface{ Stat() *pgxpool.Stat }

type statBeginner struct {
	beginner
	s stater
}

// Stat is the wrapped pool's.
func (b statBeginner) Stat() *pgxpool.Stat { return b.s.Stat() }

func (b beginner) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := b.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &hookedTx{Tx: tx}, nil
}

// hookedTx is a pgx.Tx whose Commit runs the registered functions when it succeeded. Its
// savepoints (Begin) are plain pgx transactions: Register refuses them, since their commit
// does not make anything durable.
type hookedTx struct {
	pgx.Tx
	fns []func()
}

func (t *hookedTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	fns := t.fns
	t.fns = nil
	for _, fn := range fns {
		fn()
	}
	return nil
}

// Register arranges for fn to run after tx committed. It reports false, and registers
// nothing, when tx was not begun by a [Wrap]ped Beginner (then nothing tells when it commits).
// A transaction is used by one goroutine at a time; so is Register.
func Register(tx pgx.Tx, fn func()) bool {
	t, ok := tx.(*hookedTx)
	if ok {
		t.fns = append(t.fns, fn)
	}
	return ok
}

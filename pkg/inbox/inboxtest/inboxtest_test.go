package inboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxtest"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// recordingTB is an inboxtest.TB that records failures; FailNow ends the goroutine of the
// assertion, as testing.T's does.
type recordingTB struct {
	mu     sync.Mutex
	errors []string
	failed bool
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recordingTB) FailNow() {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	runtime.Goexit()
}

// check runs an assertion the way a test runs it and returns whether it failed and its
// messages, joined.
func check(assert func(t inboxtest.TB)) (failed bool, msg string) {
	r := &recordingTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert(r)
	}()
	<-done
	return r.failed, strings.Join(r.errors, "\n")
}

// setup returns a pool on a fresh database with the inbox and a stock table.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testinfra.NewPool(t)
	ctx := context.Background()
	require.NoError(t, inbox.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL CHECK (reserved <= 2))`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stock VALUES ('sku-1', 0)`)
	require.NoError(t, err)
	return pool
}

func reserved(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT reserved FROM stock WHERE sku = 'sku-1'`).Scan(&n))
	return n
}

// reserve is a handler that reserves one unit; the third reservation breaks the CHECK.
func reserve(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + 1 WHERE sku = 'sku-1'`)
	return err
}

func TestDeliver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ProcessedThenDuplicate", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		msg := inbox.Message{ID: "m-1", Type: "order.placed"}
		calls := 0
		fn := func(ctx context.Context, tx pgx.Tx) error { calls++; return reserve(ctx, tx) }
		first := inboxtest.RequireProcessedOnce(ctx, t, pool, "stock", msg, fn, nil)
		require.True(t, first.Called)
		require.Equal(t, 1, calls)
		require.Equal(t, 1, reserved(t, pool))

		// Another consumer name processes the same message on its own.
		inboxtest.Deliver(ctx, pool, "audit", msg, nil, nil).RequireProcessed(t)
	})

	t.Run("Classes", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		for _, c := range []struct {
			name string
			err  error
			want inbox.Class
		}{
			{"Permanent", inbox.Permanent(errors.New("no such product")), inbox.ClassPermanent},
			{"Transient", inbox.Transient(errors.New("pricing service down")), inbox.ClassTransient},
			{"Plain", errors.New("something odd"), inbox.ClassFailed},
			{"Deadlock", &pgconn.PgError{Code: "40P01"}, inbox.ClassTransient},
		} {
			res := inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-" + c.name}, func(ctx context.Context, tx pgx.Tx) error {
				if err := reserve(ctx, tx); err != nil {
					return err
				}
				return c.err
			}, nil)
			require.ErrorIs(t, res.RequireError(t, c.want), c.err, c.name)
			require.True(t, res.Called)
			// Rolled back, the inbox row included: a redelivery runs the handler again.
			inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-" + c.name}, nil, nil).RequireProcessed(t)
		}
		require.Equal(t, 0, reserved(t, pool))
	})

	t.Run("RealConstraintViolation", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		for i := range 2 {
			inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: fmt.Sprint("ok-", i)}, reserve, nil).RequireProcessed(t)
		}
		res := inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "third"}, reserve, nil)
		err := res.RequireError(t, inbox.ClassFailed)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23514", pgErr.Code)
	})

	t.Run("BeforeCommitSeesTheTransaction", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		var seen int
		opts := &inboxtest.Options{BeforeCommit: func(ctx context.Context, tx pgx.Tx) {
			require.NoError(t, tx.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'sku-1'`).Scan(&seen))
		}}
		inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-1"}, reserve, opts).RequireProcessed(t)
		require.Equal(t, 1, seen)
	})

	t.Run("AssertionsFailReadably", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		processed := inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-1"}, nil, nil)
		duplicate := inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-1"}, nil, nil)
		failedRes := inboxtest.Deliver(ctx, pool, "stock", inbox.Message{ID: "m-2"}, func(context.Context, pgx.Tx) error {
			return inbox.Permanent(errors.New("bad order"))
		}, nil)
		for _, c := range []struct {
			assert func(inboxtest.TB)
			want   string
		}{
			{func(tb inboxtest.TB) { duplicate.RequireProcessed(tb) }, "want the message processed, got a duplicate"},
			{func(tb inboxtest.TB) { failedRes.RequireProcessed(tb) }, "want the message processed, got error (permanent)"},
			{func(tb inboxtest.TB) { processed.RequireDuplicate(tb) }, "want a duplicate, but the handler was called"},
			{func(tb inboxtest.TB) { failedRes.RequireError(tb, inbox.ClassTransient) }, "want a transient error, got a permanent one"},
			{func(tb inboxtest.TB) { processed.RequireError(tb, inbox.ClassFailed) }, "want a failed error, got the message processed"},
			{func(tb inboxtest.TB) {
				inboxtest.RequireProcessedOnce(ctx, tb, pool, "stock", inbox.Message{ID: "m-1"}, nil, nil)
			}, "want the message processed, got a duplicate"},
		} {
			failed, msg := check(c.assert)
			require.True(t, failed, c.want)
			require.Contains(t, msg, c.want)
		}
	})
}

// TestDeliverTables: Options.Tables records the message in the inbox of the adopter's own
// naming, in a schema of its own, and only there.
func TestDeliverTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	tables := inbox.Tables{Schema: "billing", Messages: "payments_inbox"}
	store, err := inbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))
	opts := &inboxtest.Options{Tables: tables}

	msg := inbox.Message{ID: "m-1", Type: "payment.captured"}
	inboxtest.RequireProcessedOnce(ctx, t, pool, "ledger", msg, reserve, opts)
	require.Equal(t, 1, reserved(t, pool))

	count := func(table string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE message_id = 'm-1'`).Scan(&n))
		return n
	}
	require.Equal(t, 1, count(`billing.payments_inbox`))
	require.Zero(t, count(`inbox_messages`), "the default inbox is untouched")

	// The default inbox has not seen the message: delivered there, it is processed again.
	inboxtest.Deliver(ctx, pool, "ledger", msg, nil, nil).RequireProcessed(t)

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		res := inboxtest.Deliver(ctx, pool, "ledger", inbox.Message{ID: "m-2"}, func(context.Context, pgx.Tx) error {
			t.Error("the handler must not run")
			return nil
		}, &inboxtest.Options{Tables: inbox.Tables{Messages: "bad\x00name"}})
		require.ErrorIs(t, res.Err, inbox.ErrInvalidTables)
		require.False(t, res.Called)
	})
}

// TestImportsNoBroker proves that the broker-neutral inboxtest imports neither the RabbitMQ
// adapter nor its client library: rabbitmqtest, beside the adapter, drives the consumer.
func TestImportsNoBroker(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/jackc/pgx/v5", "go list -deps lists the dependencies")
	for _, dep := range deps {
		require.NotContains(t, dep, "amqp091-go", "pkg/inbox/inboxtest depends on the RabbitMQ client")
		require.False(t, strings.HasSuffix(dep, "/rabbitmq") || strings.Contains(dep, "/rabbitmq/"),
			"pkg/inbox/inboxtest depends on the RabbitMQ adapter %s", dep)
	}
}

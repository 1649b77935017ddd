package inboxtest_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
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

func TestDeliverRabbitMQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)

	var calls sync.Map // message id → number of calls
	cfg := rabbitmq.Config{Name: "stock", MaxDeliveries: 3, Handler: func(ctx context.Context, tx pgx.Tx, d rabbitmq.Delivery) error {
		n, _ := calls.LoadOrStore(d.ID, new(int))
		*n.(*int)++
		switch string(d.Body) {
		case "permanent":
			return inbox.Permanent(errors.New("unknown product"))
		case "transient":
			return inbox.Transient(errors.New("pricing service down"))
		case "fail":
			return errors.New("not yet")
		case "panic":
			panic("nil map")
		}
		return nil
	}}
	delivery := func(id, body string, count int) rabbitmq.Delivery {
		return rabbitmq.Delivery{ID: id, Type: "order.placed", ContentType: "text/plain", Body: []byte(body), DeliveryCount: count}
	}

	t.Run("Once", func(t *testing.T) {
		t.Parallel()
		first := inboxtest.RequireHandledOnce(ctx, t, pool, cfg, delivery("once", "ok", 0), nil)
		require.True(t, first.Called)
		n, _ := calls.Load("once")
		require.Equal(t, 1, *n.(*int))
	})

	for _, c := range []struct {
		name    string
		d       rabbitmq.Delivery
		outcome inboxtest.Outcome
		reason  string
		class   inbox.Class
	}{
		{"Permanent", delivery("p", "permanent", 1), inboxtest.DeadLettered, rabbitmq.ReasonPermanent, inbox.ClassPermanent},
		{"Transient", delivery("t", "transient", 3), inboxtest.Held, "", inbox.ClassTransient},
		{"FirstFailure", delivery("f1", "fail", 0), inboxtest.Retried, "", inbox.ClassFailed},
		{"LastFailure", delivery("f3", "fail", 3), inboxtest.DeadLettered, rabbitmq.ReasonMaxDeliveries, inbox.ClassFailed},
		{"Panic", delivery("panic", "panic", 1), inboxtest.Retried, "", inbox.ClassFailed},
		{"MissingID", delivery("", "ok", 1), inboxtest.DeadLettered, rabbitmq.ReasonMissingMessageID, inbox.ClassPermanent},
		{"InvalidID", delivery("bad\x00id", "ok", 1), inboxtest.DeadLettered, rabbitmq.ReasonInvalidMessageID, inbox.ClassPermanent},
		{"InvalidType", rabbitmq.Delivery{ID: "it", Type: strings.Repeat("t", 256)}, inboxtest.DeadLettered, rabbitmq.ReasonInvalidMessageType, inbox.ClassPermanent},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := inboxtest.DeliverRabbitMQ(ctx, pool, cfg, c.d, nil)
			h.RequireOutcome(t, c.outcome, c.reason)
			require.Equal(t, c.class, h.Class)
			require.Error(t, h.Err)
		})
	}

	t.Run("PanicIsAnError", func(t *testing.T) {
		t.Parallel()
		h := inboxtest.DeliverRabbitMQ(ctx, pool, cfg, delivery("panic-2", "panic", 1), nil)
		require.ErrorContains(t, h.Err, "handler panicked: nil map")
	})

	t.Run("DefaultMaxDeliveries", func(t *testing.T) {
		t.Parallel()
		noMax := cfg
		noMax.MaxDeliveries = 0
		inboxtest.DeliverRabbitMQ(ctx, pool, noMax, delivery("d4", "fail", rabbitmq.DefaultMaxDeliveries-1), nil).
			RequireOutcome(t, inboxtest.Retried, "")
		inboxtest.DeliverRabbitMQ(ctx, pool, noMax, delivery("d5", "fail", rabbitmq.DefaultMaxDeliveries), nil).
			RequireOutcome(t, inboxtest.DeadLettered, rabbitmq.ReasonMaxDeliveries)
	})

	t.Run("RequireOutcomeFailsReadably", func(t *testing.T) {
		t.Parallel()
		h := inboxtest.DeliverRabbitMQ(ctx, pool, cfg, delivery("r", "permanent", 1), nil)
		failed, msg := check(func(tb inboxtest.TB) { h.RequireOutcome(tb, inboxtest.Acked, "") })
		require.True(t, failed)
		require.Contains(t, msg, "want the delivery acked, got dead-lettered (permanent-error) after a permanent error: inbox: handle message \"r\": unknown product")
		failed, msg = check(func(tb inboxtest.TB) { h.RequireOutcome(tb, inboxtest.DeadLettered, rabbitmq.ReasonMaxDeliveries) })
		require.True(t, failed)
		require.Contains(t, msg, "want the delivery dead-lettered (max-deliveries), got dead-lettered (permanent-error)")
	})
}

func TestDeliverRabbitMQInvalidName(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := inboxtest.DeliverRabbitMQ(context.Background(), pool, rabbitmq.Config{Handler: func(context.Context, pgx.Tx, rabbitmq.Delivery) error {
		t.Error("the handler must not run")
		return nil
	}}, rabbitmq.Delivery{ID: "m-1"}, nil)
	require.ErrorIs(t, h.Err, inbox.ErrNoConsumer)
	require.Empty(t, h.Outcome)
	failed, msg := check(func(tb inboxtest.TB) { h.RequireOutcome(tb, inboxtest.Acked, "") })
	require.True(t, failed)
	require.Contains(t, msg, "want the delivery acked, got no outcome after a failed error: inboxtest: rabbitmq.Config.Name: inbox: consumer name is empty")
}

// TestDeliverRabbitMQRefuses: what the consumer dead-letters before it opens a transaction
// (rabbitmq.Reasons; internal_test.go and consumer_test.go there show the consumer doing it),
// DeliverRabbitMQ dead-letters too, without calling the handler.
func TestDeliverRabbitMQRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	cfg := rabbitmq.Config{
		Name: "stock", Types: []string{"order.placed"}, ContentTypes: []string{"application/json", "text/plain"},
		MaxBodyBytes: 16,
		Handler: func(context.Context, pgx.Tx, rabbitmq.Delivery) error {
			t.Error("the handler must not run")
			return nil
		},
	}
	json := func(id string) rabbitmq.Delivery {
		return rabbitmq.Delivery{ID: id, Type: "order.placed", ContentType: "application/json", Body: []byte(`{}`)}
	}
	for _, c := range []struct {
		name   string
		cfg    rabbitmq.Config
		d      rabbitmq.Delivery
		reason string
	}{
		{"UnknownType", cfg, rabbitmq.Delivery{ID: "u", Type: "order.exploded", ContentType: "application/json", Body: []byte(`{}`)}, rabbitmq.ReasonUnknownType},
		{"BodyTooLarge", cfg, rabbitmq.Delivery{ID: "b", Type: "order.placed", ContentType: "text/plain", Body: []byte(strings.Repeat("x", 17))}, rabbitmq.ReasonBodyTooLarge},
		{"OtherContentType", cfg, rabbitmq.Delivery{ID: "c", Type: "order.placed", ContentType: "application/xml", Body: []byte(`<a/>`)}, rabbitmq.ReasonUnsupportedContentType},
		{"MalformedJSON", cfg, rabbitmq.Delivery{ID: "j", Type: "order.placed", ContentType: "application/json", Body: []byte(`{`)}, rabbitmq.ReasonMalformedJSON},
		// An empty content type is taken for JSON, with the defaults of every limit.
		{"NoContentTypeNotJSON", rabbitmq.Config{Name: "stock", Handler: cfg.Handler}, rabbitmq.Delivery{ID: "n", Type: "t", Body: []byte("sku-1")}, rabbitmq.ReasonMalformedJSON},
		{"DefaultMaxBodyBytes", rabbitmq.Config{Name: "stock", Handler: cfg.Handler}, rabbitmq.Delivery{ID: "d", Type: "t", ContentType: "text/plain",
			Body: make([]byte, rabbitmq.DefaultMaxBodyBytes+1)}, rabbitmq.ReasonBodyTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := inboxtest.DeliverRabbitMQ(ctx, pool, c.cfg, c.d, nil)
			h.RequireOutcome(t, inboxtest.DeadLettered, c.reason)
			require.False(t, h.Called)
			require.Equal(t, inbox.ClassPermanent, h.Class)
			require.ErrorContains(t, h.Err, c.reason)
		})
	}
	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		accept := cfg
		accept.Handler = func(context.Context, pgx.Tx, rabbitmq.Delivery) error { return nil }
		inboxtest.DeliverRabbitMQ(ctx, pool, accept, json("ok"), nil).RequireOutcome(t, inboxtest.Acked, "")
	})
}

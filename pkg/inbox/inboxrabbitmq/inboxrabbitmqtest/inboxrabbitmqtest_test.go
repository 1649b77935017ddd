package inboxrabbitmqtest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqtest"
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

func TestDeliver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)

	var calls sync.Map // message id → number of calls
	cfg := inboxrabbitmq.Config{Name: "stock", MaxDeliveries: 3, Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
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
	delivery := func(id, body string, count int) inboxrabbitmq.Delivery {
		return inboxrabbitmq.Delivery{ID: id, Type: "order.placed", ContentType: "text/plain", Body: []byte(body), DeliveryCount: count}
	}

	t.Run("Once", func(t *testing.T) {
		t.Parallel()
		first := inboxrabbitmqtest.RequireHandledOnce(ctx, t, pool, cfg, delivery("once", "ok", 0), nil)
		require.True(t, first.Called)
		n, _ := calls.Load("once")
		require.Equal(t, 1, *n.(*int))
	})

	for _, c := range []struct {
		name    string
		d       inboxrabbitmq.Delivery
		outcome inboxrabbitmqtest.Outcome
		reason  string
		class   inbox.Class
	}{
		{"Permanent", delivery("p", "permanent", 1), inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonPermanent, inbox.ClassPermanent},
		{"Transient", delivery("t", "transient", 3), inboxrabbitmqtest.Held, "", inbox.ClassTransient},
		{"FirstFailure", delivery("f1", "fail", 0), inboxrabbitmqtest.Retried, "", inbox.ClassFailed},
		{"LastFailure", delivery("f3", "fail", 3), inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonMaxDeliveries, inbox.ClassFailed},
		{"Panic", delivery("panic", "panic", 1), inboxrabbitmqtest.Retried, "", inbox.ClassFailed},
		{"MissingID", delivery("", "ok", 1), inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonMissingMessageID, inbox.ClassPermanent},
		{"InvalidID", delivery("bad\x00id", "ok", 1), inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonInvalidMessageID, inbox.ClassPermanent},
		{"InvalidType", inboxrabbitmq.Delivery{ID: "it", Type: strings.Repeat("t", 256)}, inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonInvalidMessageType, inbox.ClassPermanent},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, c.d, nil)
			h.RequireOutcome(t, c.outcome, c.reason)
			require.Equal(t, c.class, h.Class)
			require.Error(t, h.Err)
		})
	}

	t.Run("PanicIsAnError", func(t *testing.T) {
		t.Parallel()
		h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, delivery("panic-2", "panic", 1), nil)
		require.ErrorContains(t, h.Err, "handler panicked: nil map")
	})

	t.Run("DefaultMaxDeliveries", func(t *testing.T) {
		t.Parallel()
		noMax := cfg
		noMax.MaxDeliveries = 0
		inboxrabbitmqtest.Deliver(ctx, pool, noMax, delivery("d4", "fail", inboxrabbitmq.DefaultMaxDeliveries-1), nil).
			RequireOutcome(t, inboxrabbitmqtest.Retried, "")
		inboxrabbitmqtest.Deliver(ctx, pool, noMax, delivery("d5", "fail", inboxrabbitmq.DefaultMaxDeliveries), nil).
			RequireOutcome(t, inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonMaxDeliveries)
	})

	t.Run("RequireOutcomeFailsReadably", func(t *testing.T) {
		t.Parallel()
		h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, delivery("r", "permanent", 1), nil)
		failed, msg := check(func(tb inboxtest.TB) { h.RequireOutcome(tb, inboxrabbitmqtest.Acked, "") })
		require.True(t, failed)
		require.Contains(t, msg, "want the delivery acked, got dead-lettered (permanent-error) after a permanent error: handle message \"r\": unknown product")
		failed, msg = check(func(tb inboxtest.TB) {
			h.RequireOutcome(tb, inboxrabbitmqtest.DeadLettered, inboxrabbitmq.ReasonMaxDeliveries)
		})
		require.True(t, failed)
		require.Contains(t, msg, "want the delivery dead-lettered (max-deliveries), got dead-lettered (permanent-error)")
	})
}

func TestDeliverInvalidName(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := inboxrabbitmqtest.Deliver(context.Background(), pool, inboxrabbitmq.Config{Handler: func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error {
		t.Error("the handler must not run")
		return nil
	}}, inboxrabbitmq.Delivery{ID: "m-1"}, nil)
	require.ErrorIs(t, h.Err, inbox.ErrNoConsumer)
	require.Empty(t, h.Outcome)
	failed, msg := check(func(tb inboxtest.TB) { h.RequireOutcome(tb, inboxrabbitmqtest.Acked, "") })
	require.True(t, failed)
	require.Contains(t, msg, "want the delivery acked, got no outcome after a failed error: inboxrabbitmq.Config.Name: inbox: consumer name is empty")
}

// TestDeliverRefuses: what the consumer dead-letters before it opens a transaction
// (inboxrabbitmq.Reasons; internal_test.go and consumer_test.go there show the consumer doing it),
// Deliver dead-letters too, without calling the handler.
func TestDeliverRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	cfg := inboxrabbitmq.Config{
		Name: "stock", Types: []string{"order.placed"}, ContentTypes: []string{"application/json", "text/plain"},
		MaxMessageBytes: 16,
		Handler: func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error {
			t.Error("the handler must not run")
			return nil
		},
	}
	json := func(id string) inboxrabbitmq.Delivery {
		return inboxrabbitmq.Delivery{ID: id, Type: "order.placed", ContentType: "application/json", Body: []byte(`{}`)}
	}
	for _, c := range []struct {
		name   string
		cfg    inboxrabbitmq.Config
		d      inboxrabbitmq.Delivery
		reason string
	}{
		{"UnknownType", cfg, inboxrabbitmq.Delivery{ID: "u", Type: "order.exploded", ContentType: "application/json", Body: []byte(`{}`)}, inboxrabbitmq.ReasonUnknownType},
		{"BodyTooLarge", cfg, inboxrabbitmq.Delivery{ID: "b", Type: "order.placed", ContentType: "text/plain", Body: []byte(strings.Repeat("x", 17))}, inboxrabbitmq.ReasonBodyTooLarge},
		{"OtherContentType", cfg, inboxrabbitmq.Delivery{ID: "c", Type: "order.placed", ContentType: "application/xml", Body: []byte(`<a/>`)}, inboxrabbitmq.ReasonUnsupportedContentType},
		{"MalformedJSON", cfg, inboxrabbitmq.Delivery{ID: "j", Type: "order.placed", ContentType: "application/json", Body: []byte(`{`)}, inboxrabbitmq.ReasonMalformedJSON},
		// An empty content type is taken for JSON, with the defaults of every limit.
		{"NoContentTypeNotJSON", inboxrabbitmq.Config{Name: "stock", Handler: cfg.Handler}, inboxrabbitmq.Delivery{ID: "n", Type: "t", Body: []byte("sku-1")}, inboxrabbitmq.ReasonMalformedJSON},
		{"DefaultMaxMessageBytes", inboxrabbitmq.Config{Name: "stock", Handler: cfg.Handler}, inboxrabbitmq.Delivery{ID: "d", Type: "t", ContentType: "text/plain",
			Body: make([]byte, inboxrabbitmq.DefaultMaxMessageBytes+1)}, inboxrabbitmq.ReasonBodyTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := inboxrabbitmqtest.Deliver(ctx, pool, c.cfg, c.d, nil)
			h.RequireOutcome(t, inboxrabbitmqtest.DeadLettered, c.reason)
			require.False(t, h.Called)
			require.Equal(t, inbox.ClassPermanent, h.Class)
			require.ErrorContains(t, h.Err, c.reason)
		})
	}
	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		accept := cfg
		accept.Handler = func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil }
		inboxrabbitmqtest.Deliver(ctx, pool, accept, json("ok"), nil).RequireOutcome(t, inboxrabbitmqtest.Acked, "")
	})
}

// TestDeliverTables: Deliver records the delivery in the consumer's own inbox, cfg.Tables,
// and refuses Options.Tables that name another one.
func TestDeliverTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	tables := inbox.Tables{Schema: "billing", Messages: "payments_inbox"}
	store, err := inbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))
	cfg := inboxrabbitmq.Config{Name: "ledger", Tables: tables, Handler: func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil }}
	d := inboxrabbitmq.Delivery{ID: "m-1", Type: "payment.captured", ContentType: "text/plain"}

	inboxrabbitmqtest.RequireHandledOnce(ctx, t, pool, cfg, d, &inboxtest.Options{Tables: tables})
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM billing.payments_inbox WHERE consumer = 'ledger'`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages`).Scan(&n))
	require.Zero(t, n, "the default inbox is untouched")

	t.Run("OtherOptionsTables", func(t *testing.T) {
		t.Parallel()
		h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, inboxrabbitmq.Delivery{ID: "m-2", ContentType: "text/plain"}, &inboxtest.Options{Tables: inbox.Tables{Messages: "other"}})
		require.ErrorContains(t, h.Err, "is not inboxrabbitmq.Config.Tables")
		require.Empty(t, h.Outcome)
		require.False(t, h.Called)
	})
	t.Run("InvalidTables", func(t *testing.T) {
		t.Parallel()
		bad := cfg
		bad.Tables = inbox.Tables{Messages: "bad\x00name"}
		h := inboxrabbitmqtest.Deliver(ctx, pool, bad, inboxrabbitmq.Delivery{ID: "m-3", ContentType: "text/plain"}, nil)
		require.ErrorIs(t, h.Err, inbox.ErrInvalidTables)
		require.Empty(t, h.Outcome)
	})
}

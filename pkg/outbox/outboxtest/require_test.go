package outboxtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
)

// recordingTB is an outboxtest.TB that records failures; FailNow ends the goroutine of the
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

// check runs an assertion the way a test runs it and returns what it reported: whether it
// failed and its messages, joined.
func check(assert func(t outboxtest.TB)) (failed bool, msg string) {
	r := &recordingTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert(r)
	}()
	<-done
	return r.failed, strings.Join(r.errors, "\n")
}

type bundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testinfra.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))
	return &bundle{pool: pool}
}

// begin starts a transaction that is rolled back when the test ends.
func (b *bundle) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func created(id string) outbox.Message {
	return outbox.Message{
		Exchange:      "shop.events",
		RoutingKey:    "order.created",
		Type:          "OrderCreated",
		AggregateType: "order",
		AggregateID:   id,
		Payload:       json.RawMessage(fmt.Sprintf(`{"order_id": %q, "total_cents": 1250}`, id)),
		Headers:       map[string]string{outbox.HeaderCorrelationID: "req-" + id},
	}
}

func cancelled(id string) outbox.Message {
	m := created(id)
	m.RoutingKey, m.Type = "order.cancelled", "OrderCancelled"
	m.Payload = json.RawMessage(fmt.Sprintf(`{"order_id": %q}`, id))
	return m
}

func TestRequireAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	t.Run("MatchesTheOneMessage", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		msgs := []outbox.Message{created("o-1"), cancelled("o-2")}
		require.NoError(t, outbox.Add(ctx, tx, msgs...))
		m := msgs[0]
		got := outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
			Type:        "OrderCreated",
			AggregateID: "o-1",
			Payload:     map[string]any{"total_cents": 1250, "order_id": "o-1"},
			Headers:     map[string]string{outbox.HeaderCorrelationID: "req-o-1"},
		}, nil)
		require.Equal(t, m.ID, got.ID)
		require.JSONEq(t, string(m.Payload), string(got.Payload))
		require.Equal(t, m.Headers, got.Headers)
		require.False(t, got.CreatedAt.IsZero())

		outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{Payload: json.RawMessage(`{"order_id":"o-2"}`)}, nil)
		outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{ID: m.ID}, nil)
	})

	t.Run("OnlyThisTransaction", func(t *testing.T) {
		t.Parallel()
		// Committed by another transaction: visible, but not added by tx.
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, created("other")) }))
		tx := b.begin(t)
		outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{}, nil)

		// A savepoint's rows count once released, not once rolled back.
		require.NoError(t, pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return outbox.Add(ctx, sp, created("kept")) }))
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, outbox.Add(ctx, sp, created("undone")))
		require.NoError(t, sp.Rollback(ctx))
		require.NoError(t, outbox.Add(ctx, tx, cancelled("kept")))

		outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{
			{Type: "OrderCreated", AggregateID: "kept"},
			{Type: "OrderCancelled", AggregateID: "kept"},
		}, nil)
		outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{AggregateID: "other"}, nil)
		outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{AggregateID: "undone"}, nil)
	})

	t.Run("LaterTransactionCommittedMeanwhile", func(t *testing.T) {
		// Transactions that took their ids after tx's and committed while tx is open: their
		// rows are visible to tx (read committed) and newer than tx's id, but not tx's.
		t.Parallel()
		tx := b.begin(t)
		require.NoError(t, outbox.Add(ctx, tx, created("mine")))
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- pgx.BeginFunc(ctx, b.pool, func(other pgx.Tx) error {
					if err := outbox.Add(ctx, other, created(fmt.Sprintf("meanwhile-%d", i))); err != nil {
						return err
					}
					// A savepoint of the other transaction: its id is newer still.
					return pgx.BeginFunc(ctx, other, func(sp pgx.Tx) error {
						return outbox.Add(ctx, sp, cancelled(fmt.Sprintf("meanwhile-%d", i)))
					})
				})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		var visible int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM outbox_messages WHERE aggregate_id LIKE 'meanwhile-%'").Scan(&visible))
		require.Equal(t, 40, visible, "the other transactions' rows are visible to tx")
		outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{{AggregateID: "mine"}}, nil)
	})

	t.Run("ConcurrentTransactions", func(t *testing.T) {
		t.Parallel()
		tx1, tx2 := b.begin(t), b.begin(t)
		require.NoError(t, outbox.Add(ctx, tx1, created("one")))
		require.NoError(t, outbox.Add(ctx, tx2, created("two")))
		outboxtest.RequireAddedMany(ctx, t, tx1, []outboxtest.Expect{{AggregateID: "one"}}, nil)
		outboxtest.RequireAddedMany(ctx, t, tx2, []outboxtest.Expect{{AggregateID: "two"}}, nil)
	})

	t.Run("FailsWithTheDifferences", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		require.NoError(t, outbox.Add(ctx, tx, created("o-1")))
		failed, msg := check(func(tb outboxtest.TB) {
			outboxtest.RequireAdded(ctx, tb, tx, outboxtest.Expect{
				Type:    "OrderCreated",
				Payload: json.RawMessage(`{"order_id":"o-1","total_cents":999}`),
				Headers: map[string]string{outbox.HeaderCorrelationID: "req-x", "tenant": "acme"},
			}, nil)
		})
		require.True(t, failed)
		for _, want := range []string{
			"no message added by the transaction matches",
			`want: type="OrderCreated" payload={"order_id":"o-1","total_cents":999}`,
			"the transaction added 1:",
			`[0] type="OrderCreated" exchange="shop.events" routing_key="order.created" aggregate=order/o-1 payload={"order_id":"o-1","total_cents":1250}`,
			`payload: want {"order_id":"o-1","total_cents":999}, got {"order_id":"o-1","total_cents":1250}`,
			`header "correlation_id": want "req-x", got "req-o-1"`,
			`header "tenant": want "acme", missing`,
		} {
			require.Contains(t, msg, want)
		}
		require.NotContains(t, msg, "type: want") // the matching field is not reported
	})

	t.Run("FailsOnSeveralMatches", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		require.NoError(t, outbox.Add(ctx, tx, created("a"), created("b")))
		failed, msg := check(func(tb outboxtest.TB) {
			outboxtest.RequireAdded(ctx, tb, tx, outboxtest.Expect{Type: "OrderCreated"}, nil)
		})
		require.True(t, failed)
		require.Contains(t, msg, "2 messages added by the transaction match, want exactly one (messages [0 1])")
	})

	t.Run("FailsWhenNothingWasAdded", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		failed, msg := check(func(tb outboxtest.TB) {
			outboxtest.RequireAdded(ctx, tb, tx, outboxtest.Expect{Type: "OrderCreated"}, nil)
		})
		require.True(t, failed)
		require.Contains(t, msg, "the transaction added no message")
	})

	t.Run("PayloadIsComparedAsJSON", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		m := created("o-1")
		m.Payload = json.RawMessage(`{"b": [1, 2.50, {"big": 12345678901234567890}], "a": null}`)
		require.NoError(t, outbox.Add(ctx, tx, m))
		outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{Payload: []byte(`{"a":null,"b":[1,2.50,{"big":12345678901234567890}]}`)}, nil)
		for _, other := range []any{
			json.RawMessage(`{"a":null,"b":[1,2.5,{"big":12345678901234567890}]}`), // 2.5 is not written 2.50
			json.RawMessage(`{"a":null,"b":[1,2.50,{"big":12345678901234567891}]}`),
			json.RawMessage(`{"b":[1,2.50,{"big":12345678901234567890}]}`),
			"not json", // a Go string is a JSON string
		} {
			failed, _ := check(func(tb outboxtest.TB) {
				outboxtest.RequireAdded(ctx, tb, tx, outboxtest.Expect{Payload: other}, nil)
			})
			require.True(t, failed, "%s", other)
		}
		failed, msg := check(func(tb outboxtest.TB) {
			outboxtest.RequireAdded(ctx, tb, tx, outboxtest.Expect{Payload: json.RawMessage(`{oops`)}, nil)
		})
		require.True(t, failed)
		require.Contains(t, msg, "the expected payload is not JSON")
	})
}

func TestRequireAddedMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	tx := b.begin(t)
	require.NoError(t, outbox.Add(ctx, tx, created("o-1"), cancelled("o-1")))
	got := outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{{Type: "OrderCreated"}, {Type: "OrderCancelled"}}, nil)
	require.Len(t, got, 2)

	failed, msg := check(func(tb outboxtest.TB) {
		outboxtest.RequireAddedMany(ctx, tb, tx, []outboxtest.Expect{{Type: "OrderCancelled"}}, nil)
	})
	require.True(t, failed)
	require.Contains(t, msg, "the transaction added 2 messages, want 1 as listed")
	require.Contains(t, msg, `[0] type="OrderCreated"`)
	require.Contains(t, msg, `differs: type: want "OrderCancelled", got "OrderCreated"`)
	require.Contains(t, msg, `[1] unexpected: type="OrderCancelled"`)

	failed, msg = check(func(tb outboxtest.TB) {
		outboxtest.RequireAddedMany(ctx, tb, tx, []outboxtest.Expect{{Type: "OrderCreated"}, {Type: "OrderCancelled"}, {Type: "OrderShipped"}}, nil)
	})
	require.True(t, failed)
	require.Contains(t, msg, `[2] missing: want type="OrderShipped"`)
}

func TestRequireNotAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	tx := b.begin(t)
	require.NoError(t, outbox.Add(ctx, tx, created("o-1")))
	outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCancelled"}, nil)
	failed, msg := check(func(tb outboxtest.TB) {
		outboxtest.RequireNotAdded(ctx, tb, tx, outboxtest.Expect{AggregateID: "o-1"}, nil)
	})
	require.True(t, failed)
	require.Contains(t, msg, `not want: aggregate_id="o-1"`)
	require.Contains(t, msg, `[0] type="OrderCreated"`)
}

func TestAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	t.Run("InvalidTables", func(t *testing.T) {
		t.Parallel()
		_, err := outboxtest.Added(ctx, b.pool, &outboxtest.Options{Tables: outbox.Tables{Messages: strings.Repeat("x", 64)}})
		require.ErrorIs(t, err, outbox.ErrInvalidTables)
	})

	t.Run("MissingTable", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		_, err := outboxtest.Added(ctx, tx, &outboxtest.Options{Tables: outbox.Tables{Schema: "nowhere"}})
		require.ErrorContains(t, err, `"nowhere"."outbox_messages"`)
	})

	t.Run("IDsAndOrder", func(t *testing.T) {
		t.Parallel()
		tx := b.begin(t)
		want := []outbox.Message{created("x"), cancelled("x"), created("y")}
		want[1].ID = uuid.New()
		require.NoError(t, outbox.Add(ctx, tx, want[:2]...))
		require.NoError(t, outbox.Add(ctx, tx, want[2:]...))
		got, err := outboxtest.Added(ctx, tx, nil)
		require.NoError(t, err)
		require.Len(t, got, 3)
		for i := range want {
			require.Equal(t, want[i].ID, got[i].ID)
			require.Equal(t, want[i].Type, got[i].Type)
		}
	})
}

// TestTables: with Options.Tables the assertions look in the outbox of the adopter's own
// naming, in schema billing, and only there.
func TestTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tables := outbox.Tables{Schema: "billing", Messages: "payments_outbox"}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, b.pool))
	opts := &outboxtest.Options{Tables: tables}

	tx := b.begin(t)
	require.NoError(t, store.Add(ctx, tx, created("o-1")))
	require.NoError(t, outbox.Add(ctx, tx, cancelled("o-2")))

	got := outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCreated", AggregateID: "o-1"}, opts)
	require.Equal(t, map[string]string{outbox.HeaderCorrelationID: "req-o-1"}, got.Headers)
	outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCancelled"}, opts)
	outboxtest.RequireAddedMany(ctx, t, tx, []outboxtest.Expect{{AggregateID: "o-1"}}, opts)

	// The default outbox holds only what was added to it.
	outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCancelled", AggregateID: "o-2"}, nil)
	outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCreated"}, nil)

	failed, msg := check(func(tb outboxtest.TB) {
		outboxtest.RequireNotAdded(ctx, tb, tx, outboxtest.Expect{AggregateID: "o-1"}, opts)
	})
	require.True(t, failed)
	require.Contains(t, msg, `not want: aggregate_id="o-1"`)
}

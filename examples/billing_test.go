package billing_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"example.com/billing/events"
	"example.com/billing/ledger"
	"example.com/billing/payments"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's health check ends a moment after Close returns.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// TestPaymentBookedOnce captures payments over HTTP, publishes every outbox message twice
// (as a relay does that crashed between the broker's confirms and its commit), and checks
// that the ledger booked each payment exactly once and dead-lettered nothing.
func TestPaymentBookedOnce(t *testing.T) {
	t.Parallel()
	const n = 60
	b := setup(t)
	ctx := t.Context()

	var processed, duplicates atomic.Int64
	consumer, err := b.ledger.Consumer(inboxrabbitmq.Config{
		URL:         b.amqpURL,
		Concurrency: 3, // below the pool's size (4 at least): a connection is left for the test's queries
		Hooks: inboxrabbitmq.Hooks{Processed: func(p inboxrabbitmq.ProcessedMessage) {
			if p.Duplicate {
				duplicates.Add(1)
			} else {
				processed.Add(1)
			}
		}},
	})
	require.NoError(t, err)
	start(t, "consumer", consumer.Run)
	// The ledger's Setup binds its queue; a relay publishing before that has its messages
	// returned as unroutable.
	eventually(t, "consumer connected", consumer.Connected)

	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: b.amqpURL, Setup: b.topo.DeclareExchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := b.payments.Relay(twice{pub}, outbox.Config{})
	require.NoError(t, err)
	start(t, "relay", relay.Run)

	srv := httptest.NewServer(b.payments)
	t.Cleanup(srv.Close)
	want := map[string]int64{} // account → cents
	ids := map[string]bool{}
	for i := range n {
		account := fmt.Sprintf("acct-%d", i%3)
		p := capture(t, srv.URL, fmt.Sprintf(`{"account":%q,"amount_cents":%d}`, account, 100+i), http.StatusCreated)
		want[account] += p.AmountCents
		ids[p.ID] = true
	}
	require.Len(t, ids, n)

	eventually(t, "every message processed, and found a duplicate", func() bool {
		return processed.Load() == n && duplicates.Load() >= n
	})

	t.Run("each payment booked once", func(t *testing.T) {
		rows, err := b.ledgerPool.Query(ctx, `SELECT payment_id, count(*) FROM ledger.entries GROUP BY payment_id`)
		require.NoError(t, err)
		booked, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			var id string
			var count int
			if err := row.Scan(&id, &count); err != nil {
				return "", err
			}
			require.Equal(t, 1, count, "payment %s booked %d times", id, count)
			return id, nil
		})
		require.NoError(t, err)
		require.Len(t, booked, n)
		for _, id := range booked {
			require.True(t, ids[id], "booked %s, which was never captured", id)
		}
		for account, cents := range want {
			balance, err := b.ledger.Balance(ctx, account)
			require.NoError(t, err)
			require.Equal(t, cents, balance, account)
		}
	})

	t.Run("outbox drained", func(t *testing.T) {
		pending, err := b.payments.Pending(ctx)
		require.NoError(t, err)
		require.Zero(t, pending)
	})

	t.Run("nothing dead-lettered", func(t *testing.T) {
		q, err := b.channel.QueueDeclarePassive(b.topo.DeadLetterQueue, true, false, false, false, nil)
		require.NoError(t, err)
		require.Zero(t, q.Messages)
	})

	t.Run("invalid payment refused", func(t *testing.T) {
		capture(t, srv.URL, `{"account":"acct-0","amount_cents":0}`, http.StatusBadRequest)
		capture(t, srv.URL, `{"account":"","amount_cents":5}`, http.StatusBadRequest)
		pending, err := b.payments.Pending(ctx)
		require.NoError(t, err)
		require.Zero(t, pending)
	})
}

// twice publishes every batch twice, with the same message ids: every message reaches the
// ledger at least twice. A message is reported published only once both publishes were
// confirmed; otherwise the relay publishes it again later, which only adds duplicates.
type twice struct{ outbox.Publisher }

func (p twice) Publish(ctx context.Context, msgs []outbox.Message) []error {
	first := p.Publisher.Publish(ctx, msgs)
	second := p.Publisher.Publish(ctx, msgs)
	for i, err := range first {
		if err != nil {
			second[i] = err
		}
	}
	return second
}

// bundle holds the two services, each on a database of its own, the topology they share,
// and a channel to inspect the broker.
type bundle struct {
	payments   *payments.Service
	ledger     *ledger.Service
	ledgerPool *pgxpool.Pool
	topo       events.Topology
	amqpURL    string
	channel    *amqp.Channel
}

// setup gives the test two fresh databases and a topology of unique names, migrated and
// declared, and removes them all when the test ends.
func setup(t *testing.T) bundle {
	t.Helper()
	pgURL, amqpURL := os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL"), os.Getenv("OUTBOXSHOP_TEST_AMQP_URL")
	if pgURL == "" || amqpURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: OUTBOXSHOP_TEST_POSTGRES_URL and OUTBOXSHOP_TEST_AMQP_URL must be set")
		}
		t.Skip("needs PostgreSQL and RabbitMQ: set OUTBOXSHOP_TEST_POSTGRES_URL and OUTBOXSHOP_TEST_AMQP_URL")
	}
	suffix := randomSuffix()
	b := bundle{
		amqpURL: amqpURL,
		topo: events.Topology{
			Exchange:        "billing.events." + suffix,
			Queue:           "ledger.payments." + suffix,
			DeadLetterQueue: "ledger.payments.dead." + suffix,
		},
	}

	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.channel, err = conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { // after the services stopped: cleanups run last in, first out
		for _, q := range []string{b.topo.Queue, b.topo.DeadLetterQueue} {
			_, err := b.channel.QueueDelete(q, false, false, false)
			require.NoError(t, err)
		}
		require.NoError(t, b.channel.ExchangeDelete(b.topo.Exchange, false, false))
	})

	ctx := t.Context()
	payPool := database(t, pgURL, "billing_payments_"+suffix)
	b.payments, err = payments.New(payPool, b.topo, nil)
	require.NoError(t, err)
	require.NoError(t, b.payments.Migrate(ctx))
	b.ledgerPool = database(t, pgURL, "billing_ledger_"+suffix)
	b.ledger, err = ledger.New(b.ledgerPool, b.topo, nil)
	require.NoError(t, err)
	require.NoError(t, b.ledger.Migrate(ctx))
	return b
}

// database creates the database name on the server of adminURL and returns a pool on it;
// the pool is closed and the database dropped when the test ends.
func database(t *testing.T, adminURL, name string) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background() // the test's context has ended
		admin, err := pgx.Connect(ctx, adminURL)
		require.NoError(t, err)
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	u, err := url.Parse(adminURL)
	require.NoError(t, err)
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// start runs run in a goroutine until the test ends, then stops it and fails the test if
// it returned an error or did not return within a minute.
func start(t *testing.T, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, name)
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute", name)
		}
	})
}

// capture posts body to the payments service and requires the status want; on 201 it
// returns the payment.
func capture(t *testing.T, baseURL, body string, want int) events.Payment {
	t.Helper()
	resp, err := http.Post(baseURL+"/payments", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, string(got))
	var p events.Payment
	if want == http.StatusCreated {
		require.NoError(t, json.Unmarshal(got, &p))
	}
	return p
}

// eventually polls cond until it holds, failing the test after a minute: generous, for a
// loaded machine running the race detector.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a synchronisation
	}
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

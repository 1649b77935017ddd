package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// bundle is what setup gives a test: a migrated database, a broker topology of its own, and
// a publisher for it.
type bundle struct {
	pool    *pgxpool.Pool
	amqpURL string
	top     testinfra.Topology
	pub     *outboxrabbitmq.Publisher
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{pool: testinfra.NewPool(t), amqpURL: testinfra.AMQPURL(t)}
	require.NoError(t, outbox.Migrate(ctx, b.pool))
	b.top = testinfra.DeclareTopology(t, b.amqpURL)
	b.pub = newPublisher(t, b.amqpURL)
	return b
}

func newPublisher(t testing.TB, url string) *outboxrabbitmq.Publisher {
	t.Helper()
	return newPublisherConns(t, url, 1)
}

// newPublisherConns returns a publisher that sends conns batches at once.
func newPublisherConns(t testing.TB, url string, conns int) *outboxrabbitmq.Publisher {
	t.Helper()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url, Connections: conns, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("OUTBOXSHOP_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// fastConfig makes retries and outage probes quick enough for tests.
func fastConfig(t *testing.T) outbox.Config {
	return outbox.Config{
		PollInterval:    50 * time.Millisecond,
		RetryBaseDelay:  time.Millisecond,
		RetryMaxDelay:   10 * time.Millisecond,
		OutageBaseDelay: 10 * time.Millisecond,
		OutageMaxDelay:  100 * time.Millisecond,
		PublishTimeout:  5 * time.Second,
		Logger:          testLogger(t),
	}
}

// msg returns a message for the bundle's exchange.
func (b *bundle) msg(aggregate string, n int) outbox.Message {
	return outbox.Message{
		Exchange:      b.top.Exchange,
		RoutingKey:    "test.event",
		Type:          "TestEvent",
		AggregateType: "test",
		AggregateID:   aggregate,
		Payload:       json.RawMessage(fmt.Sprintf(`{"aggregate":%q,"n":%d}`, aggregate, n)),
	}
}

// write adds msgs in one committed transaction and returns them with their ids.
func (b *bundle) write(t testing.TB, msgs ...outbox.Message) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.Add(ctx, tx, msgs...)
	}))
	return msgs
}

// startRelay runs a relay until the test ends and waits for it to return.
func (b *bundle) startRelay(t *testing.T, pool outbox.RelayDB, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(pool, pub, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

func (b *bundle) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_messages WHERE "+where).Scan(&n))
	return n
}

// received collects the deliveries of a queue.
type received struct {
	mu   sync.Mutex
	msgs []amqp.Delivery
}

func (r *received) all() []amqp.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]amqp.Delivery(nil), r.msgs...)
}

func (r *received) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// ids counts the deliveries of each message id.
func (r *received) ids() map[string]int {
	seen := map[string]int{}
	for _, d := range r.all() {
		seen[d.MessageId]++
	}
	return seen
}

// consume acks and records every delivery of queue until the test ends.
func consume(t *testing.T, url, queue string) *received {
	t.Helper()
	conn, err := testinfra.DialAMQP(url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	r := &received{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			r.mu.Lock()
			r.msgs = append(r.msgs, d)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return r
}

func ids(msgs []outbox.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// conn returns a dedicated connection to the bundle's database, closed when the test ends.
func (b *bundle) conn(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), b.pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// writeOn adds msgs in one committed transaction on c.
func writeOn(t testing.TB, b *bundle, c *pgx.Conn, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		return outbox.Add(ctx, tx, msgs...)
	}))
}

// notifierLock is the advisory lock key the notify trigger of the default tables tries
// (migrations/templates/001_outbox.sql.tmpl).
const notifierLock = 8031453476610924398

// holdNotifierLock runs fn while another session holds the trigger's notifier lock, as a
// transaction in the middle of committing its notification does.
func holdNotifierLock(t testing.TB, b *bundle, fn func()) {
	t.Helper()
	ctx := context.Background()
	holder := b.conn(t)
	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(notifierLock))
	require.NoError(t, err)
	fn()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(notifierLock))
	require.NoError(t, err)
}

// lockedBuffer is a bytes.Buffer that goroutines may write at once (a logger's output).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

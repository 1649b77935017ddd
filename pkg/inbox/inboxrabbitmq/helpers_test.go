package inboxrabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

const routingKey = "orders.placed"

// bundle is what a consumer test works with: a migrated database, a topology of its own
// (an exchange and queue for the messages, another pair for dead letters), a confirming
// publisher, and what the consumer's hooks and handler saw.
type bundle struct {
	dbURL   string
	pool    *pgxpool.Pool
	amqpURL string
	top     testinfra.Topology
	dead    testinfra.Topology
	ch      *amqp.Channel // the test's own channel, in confirm mode
	logs    *logStore
	events  *events
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, testinfra.DatabaseURL(t))
}

// setupOn is setup on the empty database of dbURL.
func setupOn(t *testing.T, dbURL string) *bundle {
	t.Helper()
	return setupWith(t, dbURL, testinfra.AMQPURL(t))
}

// setupWith is setup on the empty database of dbURL and the broker of amqpURL.
func setupWith(t *testing.T, dbURL, amqpURL string) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{dbURL: dbURL, amqpURL: amqpURL, logs: &logStore{}, events: newEvents()}
	pool, err := pgxpool.New(ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool = pool
	require.NoError(t, inbox.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL, body text NOT NULL)`)
	require.NoError(t, err)

	b.top = testinfra.DeclareTopology(t, b.amqpURL)
	b.dead = testinfra.DeclareTopology(t, b.amqpURL)
	conn, err := testinfra.DialAMQP(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.ch.Confirm(false))
	return b
}

// batchSize is the BatchSize of every config: 1 unless OUTBOXSHOP_TEST_INBOX_BATCH says
// otherwise. The Makefile runs this package's tests a second time with batches of 4, so that
// every guarantee is proven with batched inbox transactions too.
var batchSize = func() int {
	n, err := strconv.Atoi(os.Getenv("OUTBOXSHOP_TEST_INBOX_BATCH"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}()

// config returns a consumer config for the bundle's queue with short delays, the test logger
// and hooks that record into b.events.
func (b *bundle) config(h inboxrabbitmq.Handler) inboxrabbitmq.Config {
	return inboxrabbitmq.Config{
		BatchSize:            batchSize,
		URL:                  b.amqpURL,
		Queue:                b.top.Queue,
		Name:                 "orders-projection",
		Handler:              h,
		Prefetch:             8,
		MaxDeliveries:        3,
		RetryBaseDelay:       10 * time.Millisecond,
		RetryMaxDelay:        50 * time.Millisecond,
		OutageBaseDelay:      20 * time.Millisecond,
		OutageMaxDelay:       200 * time.Millisecond,
		ShutdownTimeout:      10 * time.Second,
		DeadLetterExchange:   b.dead.Exchange,
		DeadLetterRoutingKey: "dead",
		Logger:               slog.New(&recordHandler{store: b.logs}),
		Hooks:                b.events.hooks(),
	}
}

// recordEffect is the usual test handler: one effects row per application.
func recordEffect(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, d.ID, string(d.Body))
	return err
}

// run starts the consumer and returns a function that stops it and checks that Run returned
// nil. The test's cleanup stops it too.
func (b *bundle) run(t *testing.T, cfg inboxrabbitmq.Config) (stop func()) {
	t.Helper()
	_, stop = b.start(t, b.pool, cfg)
	return stop
}

// start is run with a pool of the test's choice; it also returns the consumer.
func (b *bundle) start(t *testing.T, pool inbox.TxBeginner, cfg inboxrabbitmq.Config) (*inboxrabbitmq.Consumer, func()) {
	t.Helper()
	c, err := inboxrabbitmq.NewConsumer(pool, cfg)
	require.NoError(t, err)
	return c, b.runConsumer(t, c)
}

// runConsumer runs c and returns a function that stops it and checks that Run returned nil.
// The test's cleanup stops it too.
func (b *bundle) runConsumer(t *testing.T, c *inboxrabbitmq.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context being cancelled")
		}
	})
	t.Cleanup(stop)
	return stop
}

// quorumQueue declares a quorum queue with the given delivery limit whose broker dead letters
// go to the bundle's dead-letter queue, as the consumer's own do. It is deleted when the
// test ends. Publish to it through the default exchange.
func (b *bundle) quorumQueue(t *testing.T, deliveryLimit int) string {
	t.Helper()
	queue := testinfra.UniqueName(t, "qq")
	_, err := b.ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          deliveryLimit,
		"x-dead-letter-exchange":    b.dead.Exchange,
		"x-dead-letter-routing-key": "dead",
	})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.ch.QueueDelete(queue, false, false, false) })
	return queue
}

// proxiedPool returns a pool on the bundle's database through a TCP proxy the test can cut:
// the database becomes unreachable for the consumer while the test still reads it.
func (b *bundle) proxiedPool(t *testing.T) (*pgxpool.Pool, *testinfra.Proxy) {
	t.Helper()
	u, err := url.Parse(b.dbURL)
	require.NoError(t, err)
	target := u.Host
	if u.Port() == "" {
		target = u.Hostname() + ":5432"
	}
	proxy := testinfra.NewProxy(t, target)
	pool, err := pgxpool.New(context.Background(), proxy.RewriteURL(t, b.dbURL))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, proxy
}

// channel opens a channel on a connection of its own, closed when the test ends.
func (b *bundle) channel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := testinfra.DialAMQP(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// publish publishes msg to the test exchange and waits for the broker's confirm.
func (b *bundle) publish(t *testing.T, msg amqp.Publishing) {
	t.Helper()
	b.publishTo(t, b.top.Exchange, routingKey, msg)
}

func (b *bundle) publishTo(t *testing.T, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirm, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	require.NoError(t, err)
	acked, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked)
}

// jsonMessage is a well-formed message with the given id.
func jsonMessage(id string) amqp.Publishing {
	return amqp.Publishing{
		MessageId:    id,
		Type:         "order.placed",
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Body:         []byte(`{"order_id":"` + id + `"}`),
	}
}

// effects counts the effect rows of message id.
func (b *bundle) effects(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n))
	return n
}

// queueState returns the ready messages and consumers of queue.
func (b *bundle) queueState(t *testing.T, queue string) (messages, consumers int) {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages, q.Consumers
}

// getOne waits for a message in queue and takes it.
func (b *bundle) getOne(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	var got amqp.Delivery
	testinfra.Eventually(t, 20*time.Second, func() bool {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		got = d
		return ok
	}, "no message arrived in %s", queue)
	return got
}

// events records what the hooks and handlers saw.
type events struct {
	mu           sync.Mutex
	processed    int
	duplicates   int
	handlerErrs  int
	retried      []int
	deadLettered []string
	handBacks    []string
	held         int // deliveries held now
	maxHeld      int
	errs         []error
	connected    []bool
	connectedCh  chan bool
}

func newEvents() *events { return &events{connectedCh: make(chan bool, 100)} }

func (e *events) hooks() inboxrabbitmq.Hooks {
	return inboxrabbitmq.Hooks{
		Processed: func(p inboxrabbitmq.ProcessedMessage) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if p.Duplicate {
				e.duplicates++
			} else {
				e.processed++
			}
		},
		HandlerError: func(f inboxrabbitmq.HandlerFailure) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.handlerErrs++
			e.errs = append(e.errs, f.Err)
		},
		Held: func(h inboxrabbitmq.Hold) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if h.Held {
				e.held++
				e.maxHeld = max(e.maxHeld, e.held)
			} else {
				e.held--
			}
		},
		HandedBack: func(h inboxrabbitmq.HandBack) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.handBacks = append(e.handBacks, h.Reason)
		},
		Retried: func(r inboxrabbitmq.Retry) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.retried = append(e.retried, r.DeliveryCount)
		},
		DeadLettered: func(d inboxrabbitmq.DeadLetter) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.deadLettered = append(e.deadLettered, d.Reason)
		},
		Connected: func(c inboxrabbitmq.ConnectionChange) {
			e.mu.Lock()
			e.connected = append(e.connected, c.Up)
			e.mu.Unlock()
			e.connectedCh <- c.Up
		},
	}
}

func (e *events) counts() (processed, duplicates int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.processed, e.duplicates
}

func (e *events) retries() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.retried)
}

func (e *events) handedBack() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.handBacks)
}

// heldNow returns the number of deliveries held now, and the most held at once.
func (e *events) heldNow() (now, most int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held, e.maxHeld
}

func (e *events) errors() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.errs)
}

func (e *events) deadReasons() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.deadLettered)
}

// waitConnected waits for the Connected hook to report want.
func (e *events) waitConnected(t *testing.T, want bool) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case got := <-e.connectedCh:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("the consumer never reported connected=%v", want)
		}
	}
}

// waitHeldRetries waits until a delivery is held after a transient failure whose error
// contains errText, and was retried in place at least n times more.
func (b *bundle) waitHeldRetries(t *testing.T, errText string, n int) {
	t.Helper()
	matching := func(msg string) int {
		count := 0
		for _, r := range b.logs.find(msg) {
			if err, ok := r.attrs["error"].(error); ok && strings.Contains(err.Error(), errText) {
				count++
			}
		}
		return count
	}
	testinfra.Eventually(t, 30*time.Second, func() bool {
		return matching("transient failure; holding the message and retrying in place") == 1 &&
			matching("transient failure; still holding the message") >= n
	}, "no delivery held and retried %d times after %q", n, errText)
	now, _ := b.events.heldNow()
	require.Equal(t, 1, now)
}

// logStore keeps the records of every recordHandler derived from it.
type logStore struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

// find returns the records with message msg.
func (s *logStore) find(msg string) []logRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []logRecord
	for _, r := range s.records {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// recordHandler is a slog.Handler that records into a logStore, keeping attributes added
// with Logger.With.
type recordHandler struct {
	store *logStore
	attrs []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := make(map[string]any, len(h.attrs)+r.NumAttrs())
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.Any()
		return true
	})
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	h.store.records = append(h.store.records, logRecord{level: r.Level, msg: r.Message, attrs: attrs})
	return nil
}

func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordHandler{store: h.store, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *recordHandler) WithGroup(string) slog.Handler { return h }

// hostPort returns the host:port of an AMQP URL.
func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	if u.Port() == "" {
		return u.Hostname() + ":5672"
	}
	return u.Host
}

var errTransient = errors.New("transient failure")

func (s *logStore) dump(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		t.Logf("%s %s %v", r.level, r.msg, r.attrs)
	}
}

package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// The poison corpus: every kind of message a caller, older code or an operator's SQL can put
// in the outbox that the broker or PostgreSQL would choke on. For each, either Add refuses it
// with ErrInvalidMessage and writes nothing, or the relay settles its row within three of its batches
// (dead, with a last_error naming the cause, or published when it is fine after all), while
// 100 healthy rows of other aggregates written after it are all confirmed, the relay never
// leaves StateRunning for an outage, and the publisher does not reconnect.

// outcome is what a corpus case must end as.
type outcome int

const (
	refusedByAdd outcome = iota // Add returns ErrInvalidMessage; no row
	dead                        // the row is dead, last_error naming the cause
	published                   // the row is published: the message was fine
)

type poisonCase struct {
	name string
	// msg is written with Add, or by hand with SQL when byHand (a row of older code).
	msg    func(b *poisonBundle) outbox.Message
	byHand bool
	// row, instead of msg, is a row written by hand with broken columns.
	row  *handRow
	want outcome
	// cause must appear in Add's error or in the dead row's last_error.
	cause string
	// maxAttempts, when set, replaces the relay's MaxAttempts (for a failure that is
	// retried rather than permanent).
	maxAttempts int
	// maxMessageBytes, when set, replaces the corpus's MaxMessageBytes.
	maxMessageBytes int
}

// handRow is a row as an operator's INSERT might write it.
type handRow struct {
	exchange, routingKey, typ, aggregateType, aggregateID string
	payload, headers                                      string
}

// poisonBundle is a setup for one corpus case.
type poisonBundle struct {
	*bundle
	t *testing.T
	// start runs the relay until the test ends; nil: a polling relay (bundle.startRelay).
	start func(t *testing.T, pub outbox.Publisher, cfg outbox.Config)
}

const (
	corpusHealthy         = 100
	corpusMaxMessageBytes = 64 << 10
)

// sized returns a JSON payload of exactly n bytes, in the form jsonb prints it, so that it
// is stored byte for byte whether the payload column is json or jsonb.
func sized(n int) json.RawMessage {
	const frame = `{"p": ""}`
	return json.RawMessage(`{"p": "` + strings.Repeat("x", n-len(frame)) + `"}`)
}

// headersOf returns headers that, with the message's aggregate, encode to exactly n bytes.
func headersOf(m outbox.Message, n int) map[string]string {
	m.Headers = map[string]string{"pad": ""}
	m.Headers["pad"] = strings.Repeat("h", n-m.HeaderBytes())
	return m.Headers
}

func long(n int) string { return strings.Repeat("k", n) }

func poisonCases() []poisonCase {
	with := func(f func(m *outbox.Message)) func(b *poisonBundle) outbox.Message {
		return func(b *poisonBundle) outbox.Message {
			m := b.msg("poison", 1)
			f(&m)
			return m
		}
	}
	var cases []poisonCase
	// Each case written with Add is refused; the same row written by hand (by older code)
	// ends dead with the same cause.
	for _, c := range []struct {
		name, cause string
		mutate      func(m *outbox.Message)
	}{
		{"ExchangeOf256Bytes", "Exchange is 256 bytes", func(m *outbox.Message) { m.Exchange = long(256) }},
		{"RoutingKeyOf256Bytes", "RoutingKey is 256 bytes", func(m *outbox.Message) { m.RoutingKey = long(256) }},
		{"TypeOf256Bytes", "Type is 256 bytes", func(m *outbox.Message) { m.Type = long(256) }},
		{"HeaderNameOf256Bytes", "header name", func(m *outbox.Message) { m.Headers = map[string]string{long(256): "v"} }},
		{"CorrelationIDOf256Bytes", `header "correlation_id" is 256 bytes`, func(m *outbox.Message) {
			m.Headers = map[string]string{outbox.HeaderCorrelationID: long(256)}
		}},
		{"HeadersOneByteOverMaxHeaderBytes", "Headers take 65537 bytes", func(m *outbox.Message) {
			m.Headers = headersOf(*m, outbox.MaxHeaderBytes+1)
		}},
		{"HeadersAtFrameMax", "Headers take 131072 bytes", func(m *outbox.Message) { m.Headers = headersOf(*m, 131072) }},
		{"HeadersOverFrameMax", "Headers take 200000 bytes", func(m *outbox.Message) { m.Headers = headersOf(*m, 200000) }},
		{"HeaderCCString", `header name "CC" is reserved`, func(m *outbox.Message) { m.Headers = map[string]string{"CC": "q"} }},
		{"HeaderBCCString", `header name "BCC" is reserved`, func(m *outbox.Message) { m.Headers = map[string]string{"BCC": "q"} }},
		{"EmptyType", "Type is empty", func(m *outbox.Message) { m.Type = "" }},
		{"NoDestination", "no destination", func(m *outbox.Message) { m.Exchange, m.RoutingKey = "", "" }},
		{"EmptyAggregateID", "AggregateID is empty", func(m *outbox.Message) { m.AggregateID = "" }},
	} {
		cases = append(cases,
			poisonCase{name: c.name + "/ByAdd", msg: with(c.mutate), want: refusedByAdd, cause: c.cause},
			poisonCase{name: c.name + "/ByHand", msg: with(c.mutate), byHand: true, want: dead, cause: c.cause})
	}
	// A header the publisher sets itself: Add refuses it rather than drop the caller's value
	// silently; a row of older code that has one is published, with the aggregate's value.
	reservedHeader := with(func(m *outbox.Message) { m.Headers = map[string]string{outbox.HeaderAggregateID: "other"} })
	cases = append(cases,
		poisonCase{name: "HeaderAggregateID/ByAdd", msg: reservedHeader, want: refusedByAdd, cause: `header name "aggregate_id" is reserved`},
		poisonCase{name: "HeaderAggregateID/ByHand", msg: reservedHeader, byHand: true, want: published})
	// What PostgreSQL cannot store at all: only Add can be handed it.
	for _, c := range []struct {
		name, cause string
		mutate      func(m *outbox.Message)
	}{
		{"InvalidUTF8InPayloadString", "Payload is not valid UTF-8", func(m *outbox.Message) { m.Payload = json.RawMessage("{\"s\":\"\xff\xfe\"}") }},
		{"InvalidUTF8InHeaderValue", "is not valid UTF-8", func(m *outbox.Message) { m.Headers = map[string]string{"h": "\xc3\x28"} }},
		{"InvalidUTF8InHeaderName", "is not valid UTF-8", func(m *outbox.Message) { m.Headers = map[string]string{"\xc3\x28": "v"} }},
		{"InvalidUTF8InAggregateID", "AggregateID is not valid UTF-8", func(m *outbox.Message) { m.AggregateID = "a\x80" }},
		{"NULInType", "Type contains a NUL byte", func(m *outbox.Message) { m.Type = "T\x00" }},
		{"NULInHeaderValue", "contains a NUL byte", func(m *outbox.Message) { m.Headers = map[string]string{"h": "a\x00b"} }},
		{"NULInRoutingKey", "RoutingKey contains a NUL byte", func(m *outbox.Message) { m.RoutingKey = "k\x00" }},
		{"RawNULInPayload", "Payload is not valid JSON", func(m *outbox.Message) { m.Payload = json.RawMessage("{\"s\":\"\x00\"}") }},
		{"PayloadNotJSON", "Payload is not valid JSON", func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":`) }},
	} {
		cases = append(cases, poisonCase{name: c.name, msg: with(c.mutate), want: refusedByAdd, cause: c.cause})
	}
	// At the limits: these must publish.
	for _, c := range []struct {
		name   string
		mutate func(b *poisonBundle, m *outbox.Message)
	}{
		{"ExchangeOf255Bytes", func(b *poisonBundle, m *outbox.Message) { m.Exchange = b.exchangeOfLength(255) }},
		{"RoutingKeyOf255Bytes", func(_ *poisonBundle, m *outbox.Message) { m.RoutingKey = long(255) }},
		{"TypeOf255Bytes", func(_ *poisonBundle, m *outbox.Message) { m.Type = long(255) }},
		{"HeaderNameOf255Bytes", func(_ *poisonBundle, m *outbox.Message) { m.Headers = map[string]string{long(255): "v"} }},
		{"CorrelationIDOf255Bytes", func(_ *poisonBundle, m *outbox.Message) {
			m.Headers = map[string]string{outbox.HeaderCorrelationID: long(255)}
		}},
		{"HeadersAtMaxHeaderBytes", func(_ *poisonBundle, m *outbox.Message) { m.Headers = headersOf(*m, outbox.MaxHeaderBytes) }},
		{"PayloadAtMaxMessageBytes", func(_ *poisonBundle, m *outbox.Message) { m.Payload = sized(corpusMaxMessageBytes) }},
	} {
		cases = append(cases, poisonCase{name: c.name, want: published, msg: func(b *poisonBundle) outbox.Message {
			m := b.msg("poison", 1)
			c.mutate(b, &m)
			return m
		}})
	}
	cases = append(cases,
		poisonCase{name: "PayloadOneByteOverMaxMessageBytes", want: dead, cause: "exceeds MaxMessageBytes",
			msg: with(func(m *outbox.Message) { m.Payload = sized(corpusMaxMessageBytes + 1) })},
		// The exchange does not exist: the broker closes the channel (404) without naming
		// the message. Not the message's content, so it is retried until MaxAttempts.
		poisonCase{name: "ExchangeMissing", want: dead, cause: "404 NOT_FOUND", maxAttempts: 3,
			msg: with(func(m *outbox.Message) { m.Exchange += ".missing" })},
	)
	// Rows written by hand with columns the relay cannot read as a message.
	for _, c := range []struct {
		name, headers, cause string
		want                 outcome
	}{
		{"HeadersArray", `["h"]`, "headers", dead},
		{"HeadersString", `"h"`, "headers", dead},
		{"HeaderNumber", `{"n": 1}`, "headers", dead},
		{"HeaderNestedObject", `{"o": {"a": "b"}}`, "headers", dead},
		{"HeaderArray", `{"a": ["x"]}`, "headers", dead},
		{"HeaderBoolean", `{"b": true}`, "headers", dead},
		{"HeaderCCArray", `{"CC": ["q"]}`, "headers", dead},
		{"HeaderCCNumber", `{"CC": 1}`, "headers", dead},
		// A JSON null reads as an empty string header, or as no headers: harmless.
		{"HeaderNull", `{"a": null}`, "", published},
		{"HeadersNull", `null`, "", published},
	} {
		cases = append(cases, poisonCase{name: c.name, want: c.want, cause: c.cause,
			row: &handRow{routingKey: "test.event", typ: "TestEvent", aggregateType: "test", aggregateID: "poison",
				payload: `{"poison":true}`, headers: c.headers}})
	}
	return cases
}

func TestPoisonCorpus(t *testing.T) {
	t.Parallel()
	cases := poisonCases()
	require.GreaterOrEqual(t, len(cases), 15)
	var refused, relayed []poisonCase
	for _, c := range cases {
		if c.want == refusedByAdd {
			refused = append(refused, c)
		} else {
			relayed = append(relayed, c)
		}
	}

	t.Run("RefusedByAdd", func(t *testing.T) {
		t.Parallel()
		b := &poisonBundle{bundle: setup(t), t: t}
		for _, c := range refused {
			t.Run(c.name, func(t *testing.T) { runPoisonCase(t, b, c, outboxrabbitmq.Config{}) })
		}
	})
	// The relayed cases run one after the other on two databases (one per core): a database
	// per case would spend most of the time creating and dropping databases.
	const groups = 2
	for g := range groups {
		t.Run(fmt.Sprintf("Relayed%d", g), func(t *testing.T) {
			t.Parallel()
			b := &poisonBundle{bundle: setup(t), t: t}
			for i := g; i < len(relayed); i += groups {
				c := relayed[i]
				t.Run(c.name, func(t *testing.T) {
					b.t = t
					b.reset(t)
					runPoisonCase(t, b, c, outboxrabbitmq.Config{})
				})
			}
		})
	}
}

// reset empties the outbox and the queue for the next case.
func (b *poisonBundle) reset(t *testing.T) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "TRUNCATE outbox_messages")
	require.NoError(t, err)
	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueuePurge(b.top.Queue, false)
	require.NoError(t, err)
}

// exchangeOfLength declares an exchange of a name of exactly n bytes, bound to the bundle's
// queue, and deletes it when the test ends.
func (b *poisonBundle) exchangeOfLength(n int) string {
	t := b.t
	name := b.top.Exchange + "."
	name += strings.Repeat("x", n-len(name))
	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(name, "topic", false, false, false, false, nil))
	require.NoError(t, ch.QueueBind(b.top.Queue, "#", name, false, nil))
	testinfra.DeleteExchangeAtCleanup(t, b.amqpURL, name)
	return name
}

// insertByHand writes a row the way an operator's SQL would, without Add's checks. The
// parameters take the columns' own types.
const insertByHand = `
INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// corpusWatch records what the relay and the publisher did during a corpus case.
type corpusWatch struct {
	cycles   atomic.Int32 // relay cycles that claimed rows
	connects atomic.Int32
	mu       sync.Mutex
	settled  map[uuid.UUID]int32 // the claim count when a row was published or buried
	states   []outbox.State
}

func (w *corpusWatch) hooks() outbox.Hooks {
	return outbox.Hooks{
		Polled: func(p outbox.Poll) {
			if p.Claimed > 0 {
				w.cycles.Add(1)
			}
		},
		BatchDone: func(r outbox.BatchResult) {
			w.mu.Lock()
			defer w.mu.Unlock()
			cycle := w.cycles.Load()
			for _, m := range r.Published {
				w.settled[m.ID] = cycle
			}
			for _, f := range r.Failed {
				if f.Dead {
					w.settled[f.Message.ID] = cycle
				}
			}
		},
		StateChanged: func(c outbox.StateChange) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.states = append(w.states, c.To)
		},
	}
}

func (w *corpusWatch) settledIn(id uuid.UUID) (int32, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.settled[id]
	return c, ok
}

func runPoisonCase(t *testing.T, b *poisonBundle, c poisonCase, pubCfg outboxrabbitmq.Config) {
	ctx := context.Background()

	// The poison row first, then the healthy ones: it heads the first batch.
	var poisonID uuid.UUID
	switch {
	case c.row != nil:
		poisonID = uuid.New()
		r := c.row
		_, err := b.pool.Exec(ctx, insertByHand, poisonID, b.top.Exchange, r.routingKey, r.typ, r.aggregateType, r.aggregateID, r.payload, r.headers)
		require.NoError(t, err)
	case c.byHand:
		m := c.msg(b)
		poisonID = uuid.New()
		headers, err := json.Marshal(m.Headers)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, insertByHand, poisonID, m.Exchange, m.RoutingKey, m.Type, m.AggregateType, m.AggregateID, string(m.Payload), string(headers))
		require.NoError(t, err)
	default:
		m := c.msg(b)
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, m) })
		if c.want == refusedByAdd {
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.ErrorContains(t, err, c.cause)
			require.Zero(t, b.count(t, "true"), "Add wrote nothing")
			return
		} else {
			require.NoError(t, err)
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT id FROM outbox_messages").Scan(&poisonID))
		}
	}
	healthy := make([]outbox.Message, corpusHealthy)
	for i := range healthy {
		healthy[i] = b.msg(fmt.Sprintf("healthy-%d", i), i)
	}
	healthy = b.write(t, healthy...)

	w := &corpusWatch{settled: map[uuid.UUID]int32{}}
	pubCfg.URL = b.amqpURL
	pubCfg.Logger = testLogger(t)
	pubCfg.Hooks.Connected = func(c outboxrabbitmq.ConnectionChange) {
		if c.Up {
			w.connects.Add(1)
		}
	}
	rpub, err := outboxrabbitmq.New(pubCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rpub.Close() })
	pub := &sendCounter{Publisher: rpub, id: poisonID}
	cfg := fastConfig(t)
	cfg.MaxMessageBytes = corpusMaxMessageBytes
	cfg.RetryBaseDelay, cfg.RetryMaxDelay = time.Nanosecond, time.Nanosecond // retries due at once
	if c.maxMessageBytes > 0 {
		cfg.MaxMessageBytes = c.maxMessageBytes
	}
	if c.maxAttempts > 0 {
		cfg.MaxAttempts = c.maxAttempts
	}
	cfg.Hooks = w.hooks()
	if b.start != nil {
		b.start(t, pub, cfg)
	} else {
		b.startRelay(t, b.pool, pub, cfg)
	}

	// BatchDone reports a cycle after its commit: wait for the hooks, then read the rows.
	testinfra.Eventually(t, waitFor, func() bool {
		for _, m := range healthy {
			if _, ok := w.settledIn(m.ID); !ok {
				return false
			}
		}
		_, ok := w.settledIn(poisonID)
		return poisonID == uuid.Nil || ok
	}, "every healthy row published and the poison row settled")
	require.Equal(t, corpusHealthy, b.count(t, "published_at IS NOT NULL AND aggregate_id LIKE 'healthy-%'"), "every healthy row confirmed")
	wantDepth := corpusHealthy
	if poisonID != uuid.Nil {
		_, ok := w.settledIn(poisonID)
		require.True(t, ok)
		// Batches that handed it to the publisher: a row the relay buries before sending
		// it (unreadable headers, over MaxMessageBytes) settles in its first batch.
		require.LessOrEqual(t, pub.sends.Load(), int32(3), "the poison row settled within 3 of its batches")
		var publishedAt, deadAt *time.Time
		var lastError *string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT published_at, dead_at, last_error FROM outbox_messages WHERE id = $1", poisonID).
			Scan(&publishedAt, &deadAt, &lastError))
		switch c.want {
		case dead:
			require.NotNil(t, deadAt, "poison row dead")
			require.NotNil(t, lastError)
			require.Contains(t, *lastError, c.cause)
		case published:
			require.NotNil(t, publishedAt, "a message at the limits is published")
			wantDepth++
		}
	}
	require.Equal(t, wantDepth, queueDepth(t, b.amqpURL, b.top.Queue), "every confirmed message is in the queue, once")

	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.states {
		require.Equal(t, outbox.StateRunning, s, "the relay never leaves running: a message's fault is no outage")
	}
	require.LessOrEqual(t, w.connects.Load(), int32(2), "the publisher reconnects at most twice")
	t.Logf("settled in %d claims, the poison row sent in %d batch(es), with %d connection(s)", w.cycles.Load(), pub.sends.Load(), w.connects.Load())
}

// sendCounter counts the Publish calls that carry the row id: the relay's batches that sent
// it. (Counting the relay's claims instead would count batches claimed ahead, while the
// row's batch was in flight.)
type sendCounter struct {
	*outboxrabbitmq.Publisher
	id    uuid.UUID
	sends atomic.Int32
}

func (p *sendCounter) Publish(ctx context.Context, msgs []outbox.Message) []error {
	for _, m := range msgs {
		if m.ID == p.id {
			p.sends.Add(1)
		}
	}
	return p.Publisher.Publish(ctx, msgs)
}

func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

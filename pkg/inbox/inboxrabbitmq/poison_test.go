package inboxrabbitmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// poisonHandler is a handler of version 1 order.placed events, as a service would write it:
// it refuses what it cannot understand with inbox.Permanent and writes through tx.
func poisonHandler(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
	var ev struct {
		Version  int    `json:"version"`
		OrderID  string `json:"order_id"`
		Quantity string `json:"quantity"`
		SKU      string `json:"sku"`
	}
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		return inbox.Permanent(fmt.Errorf("decode order.placed: %w", err))
	}
	if ev.Version != 1 {
		return inbox.Permanent(fmt.Errorf("order.placed version %d is not supported (1 is)", ev.Version))
	}
	if ev.OrderID == "" {
		return inbox.Permanent(errors.New("order.placed: order_id is missing"))
	}
	// A quantity PostgreSQL cannot read: a data exception (22P02).
	if _, err := tx.Exec(ctx, `SELECT $1::int`, ev.Quantity); err != nil {
		return fmt.Errorf("read quantity: %w", err)
	}
	// A SKU reserved twice by the same order: an integrity violation (23505).
	if ev.SKU != "" {
		for range 2 {
			if _, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku) VALUES ($1, $2)`, ev.OrderID, ev.SKU); err != nil {
				return fmt.Errorf("reserve %s: %w", ev.SKU, err)
			}
		}
	}
	return recordEffect(ctx, tx, d)
}

// TestPoisonCorpus publishes every kind of bad message the consumer can meet between 100
// healthy ones. Each bad one must reach the dead-letter queue with its reason within 2s,
// be counted by reason in the metrics, and hold up nothing: all healthy messages are
// processed, once.
func TestPoisonCorpus(t *testing.T) {
	t.Parallel()
	const deadline = 2 * time.Second
	b := setup(t)
	_, err := b.pool.Exec(t.Context(), `CREATE TABLE reservations (order_id text, sku text, PRIMARY KEY (order_id, sku))`)
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	m, err := inboxrabbitmqmetrics.NewConsumer(reg, inboxrabbitmqmetrics.Config{KnownTypes: []string{"order.placed"}})
	require.NoError(t, err)
	cfg := b.config(poisonHandler)
	cfg.Hooks = m.Hooks(cfg.Hooks)
	cfg.ContentTypes = []string{"application/json"}
	cfg.Types = []string{"order.placed"}
	cfg.MaxMessageBytes = 4096
	m.Init(cfg.Name)

	// The dead-letter queue is watched from the start, to time each arrival.
	type arrival struct {
		at     time.Time
		reason string
	}
	var (
		mu      sync.Mutex
		arrived = map[string]arrival{} // by correlation id, the name of the kind
		extra   []string
	)
	deliveries, err := b.channel(t).Consume(b.dead.Queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	go func() {
		for d := range deliveries {
			reason, _ := d.Headers[inboxrabbitmq.HeaderDeadReason].(string)
			mu.Lock()
			if _, dup := arrived[d.CorrelationId]; dup {
				extra = append(extra, d.CorrelationId)
			}
			arrived[d.CorrelationId] = arrival{at: time.Now(), reason: reason}
			mu.Unlock()
		}
	}()
	b.run(t, cfg)

	event := func(id, body string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Type: "order.placed", ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: []byte(body)}
	}
	healthy := func(i int) amqp.Publishing {
		id := fmt.Sprintf("order-%d", i)
		return event(id, `{"version":1,"order_id":"`+id+`","quantity":"2"}`)
	}
	with := func(p amqp.Publishing, change func(*amqp.Publishing)) amqp.Publishing {
		change(&p)
		return p
	}
	ok := `{"version":1,"order_id":"o-1","quantity":"1"}`
	corpus := []struct {
		kind   string
		msg    amqp.Publishing
		reason string // the prefix of the dead reason header
	}{
		{"nul-in-id", event("order\x00-1", ok), inboxrabbitmq.ReasonInvalidMessageID + ": inbox: invalid message id: contains a NUL byte"},
		{"invalid-utf8-in-id", event("k\xff\xfe", ok), inboxrabbitmq.ReasonInvalidMessageID + ": inbox: invalid message id: not valid UTF-8"},
		{"nul-in-type", with(event("p-3", ok), func(p *amqp.Publishing) { p.Type = "order\x00placed" }),
			inboxrabbitmq.ReasonInvalidMessageType + ": inbox: invalid message type: contains a NUL byte"},
		{"invalid-utf8-in-type", with(event("p-4", ok), func(p *amqp.Publishing) { p.Type = "order.\xc3(" }),
			inboxrabbitmq.ReasonInvalidMessageType + ": inbox: invalid message type: not valid UTF-8"},
		{"missing-id", event("", ok), inboxrabbitmq.ReasonMissingMessageID + ": "},
		{"oversized-body", event("p-6", `{"version":1,"order_id":"o-6","pad":"`+strings.Repeat("x", 5000)+`"}`),
			inboxrabbitmq.ReasonBodyTooLarge + ": the body has 5039 bytes, more than the 4096 accepted"},
		{"non-json", event("p-7", `order o-7, 2 pieces`), inboxrabbitmq.ReasonMalformedJSON + ": body is not valid JSON"},
		{"invalid-utf8-in-json", event("p-8", "{\"version\":1,\"order_id\":\"o-\xff\"}"), inboxrabbitmq.ReasonMalformedJSON + ": body is not valid UTF-8"},
		{"wrong-content-type", with(event("p-9", ok), func(p *amqp.Publishing) { p.ContentType = "text/plain" }),
			inboxrabbitmq.ReasonUnsupportedContentType + ": content type \"text/plain\""},
		{"latin1-json", with(event("p-10", ok), func(p *amqp.Publishing) { p.ContentType = "application/json; charset=iso-8859-1" }),
			inboxrabbitmq.ReasonUnsupportedContentType + ": content type \"application/json; charset=iso-8859-1\": JSON must be UTF-8"},
		{"unknown-type", with(event("p-11", ok), func(p *amqp.Publishing) { p.Type = "order.exploded" }),
			inboxrabbitmq.ReasonUnknownType + ": type \"order.exploded\""},
		{"unknown-version", event("p-12", `{"version":2,"order_id":"o-12"}`),
			inboxrabbitmq.ReasonPermanent + ": order.placed version 2 is not supported (1 is)"},
		{"handler-refuses", event("p-13", `{"version":1}`), inboxrabbitmq.ReasonPermanent + ": order.placed: order_id is missing"},
		{"data-exception", event("p-14", `{"version":1,"order_id":"o-14","quantity":"two"}`),
			inboxrabbitmq.ReasonMaxDeliveries + ": failed on all 3 attempts; last error: read quantity: ERROR: invalid input syntax for type integer: \"two\" (SQLSTATE 22P02)"},
		{"integrity-violation", event("p-15", `{"version":1,"order_id":"o-15","quantity":"1","sku":"BOOK-1"}`),
			inboxrabbitmq.ReasonMaxDeliveries + ": failed on all 3 attempts; last error: reserve BOOK-1: ERROR: duplicate key value violates unique constraint \"reservations_pkey\" (SQLSTATE 23505)"},
	}
	wantByReason := map[string]int{}
	published := map[string]time.Time{}
	const healthyCount = 100
	next := 0
	for i := range healthyCount {
		b.publish(t, healthy(i))
		if i%6 == 3 && next < len(corpus) {
			p := corpus[next]
			p.msg.CorrelationId = p.kind
			published[p.kind] = time.Now()
			b.publish(t, p.msg)
			wantByReason[strings.SplitN(p.reason, ":", 2)[0]]++
			next++
		}
	}
	require.Equal(t, len(corpus), next, "not every kind was published")

	testinfra.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		processed, _ := b.events.counts()
		return len(arrived) == len(corpus) && processed == healthyCount
	}, "not every bad message was dead-lettered, or not every healthy one processed")

	mu.Lock()
	for _, p := range corpus {
		got, ok := arrived[p.kind]
		require.True(t, ok, p.kind)
		require.True(t, strings.HasPrefix(got.reason, p.reason), "%s: reason %q, want prefix %q", p.kind, got.reason, p.reason)
		took := got.at.Sub(published[p.kind])
		require.LessOrEqual(t, took, deadline, "%s took %s to reach the dead-letter queue", p.kind, took)
		t.Logf("%-22s dead-lettered after %4dms: %.90s", p.kind, took.Milliseconds(), got.reason)
	}
	require.Empty(t, extra, "dead-lettered twice")
	mu.Unlock()

	for i := range healthyCount {
		require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
	}
	var effects int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&effects))
	require.Equal(t, healthyCount, effects, "a bad message had an effect")

	// Counted by reason; every reason the consumer knows appears in the corpus.
	got := map[string]int{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "inbox_dead_lettered_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "reason" && s.GetCounter().GetValue() > 0 {
					got[l.GetValue()] += int(s.GetCounter().GetValue())
				}
			}
		}
	}
	require.Equal(t, wantByReason, got)
	for _, reason := range inboxrabbitmq.Reasons() {
		require.Contains(t, got, reason, "the corpus has no message for reason %s", reason)
	}
	require.Empty(t, b.events.handedBack())
	messages, _ := b.queueState(t, b.top.Queue)
	require.Zero(t, messages)
}

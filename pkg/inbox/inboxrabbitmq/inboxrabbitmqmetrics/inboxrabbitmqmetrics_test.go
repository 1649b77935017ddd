package inboxrabbitmqmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestConsumerMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, inbox.Migrate(ctx, pool))
	url := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, url)
	dead := testinfra.DeclareTopology(t, url)

	reg := prometheus.NewPedanticRegistry()
	m, err := inboxrabbitmqmetrics.NewConsumer(reg, inboxrabbitmqmetrics.Config{KnownTypes: []string{"OrderCreated"}, ConstLabels: prometheus.Labels{"service": "test"}})
	require.NoError(t, err)
	m.Init("warehouse")

	var once sync.Once
	c, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL: url, Queue: top.Queue, Name: "warehouse",
		DeadLetterExchange: dead.Exchange, DeadLetterRoutingKey: "dead",
		RetryBaseDelay: 10 * time.Millisecond,
		Handler: func(_ context.Context, _ pgx.Tx, d inboxrabbitmq.Delivery) error {
			var err error
			if d.ID == "m4" {
				once.Do(func() { err = inbox.Transient(errors.New("the stock service is down")) })
			}
			return err
		},
		Hooks: m.Hooks(inboxrabbitmq.Hooks{}),
	})
	require.NoError(t, err)
	// pgxpool's default of max(4, CPUs) connections against the default Concurrency of 32.
	m.SetPoolSize("warehouse", c.PoolSize())
	require.Equal(t, float64(max(0, inboxrabbitmq.DefaultPrefetch-int(pool.Stat().MaxConns()))),
		value(t, reg, "inbox_pool_shortfall_connections", ""))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	publish := func(p amqp.Publishing) {
		p.ContentType = "application/json"
		require.NoError(t, ch.PublishWithContext(ctx, top.Exchange, "k", false, false, p))
	}
	publish(amqp.Publishing{MessageId: "m1", Type: "OrderCreated", Body: []byte(`{}`)})
	publish(amqp.Publishing{MessageId: "m1", Type: "OrderCreated", Body: []byte(`{}`)}) // duplicate
	publish(amqp.Publishing{MessageId: "m2", Type: "Invented" + t.Name(), Body: []byte(`{}`)})
	publish(amqp.Publishing{MessageId: "m3", Type: "OrderCreated", Body: []byte(`{not json`)})
	publish(amqp.Publishing{MessageId: "m4", Type: "OrderCreated", Body: []byte(`{}`)}) // transient once

	testinfra.Eventually(t, 20*time.Second, func() bool {
		return value(t, reg, "inbox_dead_lettered_total", "OrderCreated", "malformed-json") == 1 &&
			value(t, reg, "inbox_duplicates_total", "OrderCreated") == 1 &&
			value(t, reg, "inbox_messages_processed_total", inboxrabbitmqmetrics.OtherType) == 1 &&
			value(t, reg, "inbox_messages_processed_total", "OrderCreated") == 2
	}, "messages counted")

	require.Equal(t, 1.0, value(t, reg, "inbox_broker_connected", ""))
	require.Equal(t, 1.0, value(t, reg, "inbox_transient_errors_total", "OrderCreated"))
	require.Equal(t, 1.0, value(t, reg, "inbox_handler_errors_total", "OrderCreated"))
	require.Zero(t, value(t, reg, "inbox_held_messages", ""), "the hold ended")
	var expected strings.Builder
	expected.WriteString(`
# HELP inbox_dead_lettered_total Messages sent to the dead-letter queue.
# TYPE inbox_dead_lettered_total counter
`)
	for _, typ := range []string{"OrderCreated", inboxrabbitmqmetrics.OtherType} {
		reasons := inboxrabbitmq.Reasons()
		slices.Sort(reasons) // the exposition format sorts series by label values
		for _, reason := range reasons {
			n := 0
			if typ == "OrderCreated" && reason == inboxrabbitmq.ReasonMalformedJSON {
				n = 1
			}
			fmt.Fprintf(&expected, "inbox_dead_lettered_total{consumer=\"warehouse\",reason=%q,service=\"test\",type=%q} %d\n", reason, typ, n)
		}
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected.String()), "inbox_dead_lettered_total"))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// value reads the series of family name whose type label is typ (any series when typ is "")
// and, when given, whose reason label is reason.
func value(t *testing.T, reg *prometheus.Registry, name, typ string, reason ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if typ != "" && labels["type"] != typ || len(reason) > 0 && labels["reason"] != reason[0] {
				continue
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

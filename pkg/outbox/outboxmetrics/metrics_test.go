package outboxmetrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestRelayAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	url := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, url)
	nowhere := testinfra.UniqueName(t, "nowhere")
	testinfra.DeleteExchangeAtCleanup(t, url, nowhere)

	reg := prometheus.NewPedanticRegistry()
	relayMetrics, err := outboxmetrics.NewRelay(reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	pubMetrics, err := outboxrabbitmqmetrics.NewPublisher(reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	stats, err := outboxmetrics.NewStats(reg, pool, outboxmetrics.StatsConfig{ConstLabels: prometheus.Labels{"service": "test"}})
	require.NoError(t, err)

	msg := func(exchange, agg string) outbox.Message {
		return outbox.Message{Exchange: exchange, RoutingKey: "k", Type: "T", AggregateType: "a", AggregateID: agg, Payload: json.RawMessage(`{}`)}
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Add(ctx, tx, msg(top.Exchange, "1"), msg(top.Exchange, "2"), msg(top.Exchange, "3"), msg(nowhere, "4"))
	}))

	require.NoError(t, stats.Refresh(ctx))
	require.InDelta(t, 4, testutil.ToFloat64(metric(t, reg, "outbox_pending_messages")), 0)
	require.Zero(t, testutil.ToFloat64(metric(t, reg, "outbox_wal_slot_exists")), "no WAL relay, no slot")
	require.True(t, math.IsInf(testutil.ToFloat64(metric(t, reg, "outbox_wal_slot_safe_bytes")), 1))

	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url, Hooks: pubMetrics.Hooks(outboxrabbitmq.Hooks{}), Setup: func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(nowhere, "topic", false, true, false, false, nil) // bound to nothing
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{
		MaxAttempts: 1, PollInterval: 20 * time.Millisecond,
		Hooks: relayMetrics.Hooks(outbox.Hooks{}),
	})
	require.NoError(t, err)
	relayMetrics.SetPoolSize(relay.PoolSize()) // pgxpool's default of 4 connections at least: enough
	require.Zero(t, testutil.ToFloat64(metric(t, reg, "outbox_pool_shortfall_connections")))
	relayMetrics.SetPoolSize(outbox.PoolSize{Needed: 3, Max: 2})
	require.Equal(t, 1.0, testutil.ToFloat64(metric(t, reg, "outbox_pool_shortfall_connections")))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	// The relay says it is running once its first cycle returned, after that cycle's batch
	// was counted: the test waits for both.
	running := `
# HELP outbox_relay_state 1 for the relay's current state, 0 for the others.
# TYPE outbox_relay_state gauge
outbox_relay_state{service="test",state="broker_unavailable"} 0
outbox_relay_state{service="test",state="database_unavailable"} 0
outbox_relay_state{service="test",state="running"} 1
outbox_relay_state{service="test",state="standby"} 0
outbox_relay_state{service="test",state="starting"} 0
outbox_relay_state{service="test",state="stopped"} 0
`
	testinfra.Eventually(t, 20*time.Second, func() bool {
		return testutil.ToFloat64(metric(t, reg, "outbox_published_total")) == 3 &&
			testutil.ToFloat64(metric(t, reg, "outbox_dead_total")) == 1 &&
			testutil.GatherAndCompare(reg, stringsReader(running), "outbox_relay_state") == nil
	}, "published and dead counted, the relay running")

	expected := `
# HELP outbox_publish_errors_total Failed publish attempts by reason; unavailable counts rows left untouched by a broker outage.
# TYPE outbox_publish_errors_total counter
outbox_publish_errors_total{reason="nacked",service="test"} 0
outbox_publish_errors_total{reason="other",service="test"} 0
outbox_publish_errors_total{reason="permanent",service="test"} 0
outbox_publish_errors_total{reason="too_large",service="test"} 0
outbox_publish_errors_total{reason="unavailable",service="test"} 0
outbox_publish_errors_total{reason="unroutable",service="test"} 1
# HELP outbox_broker_connected 1 while the publisher has a broker connection.
# TYPE outbox_broker_connected gauge
outbox_broker_connected{service="test"} 1
` + running
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(expected),
		"outbox_publish_errors_total", "outbox_relay_state", "outbox_broker_connected"))
	require.Positive(t, testutil.ToFloat64(metric(t, reg, "outbox_last_poll_timestamp_seconds")))
	require.Positive(t, testutil.ToFloat64(metric(t, reg, "outbox_last_publish_timestamp_seconds")))
	n, err := testutil.GatherAndCount(reg, "outbox_commit_to_confirm_seconds", "outbox_batch_size")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	require.NoError(t, stats.Refresh(ctx))
	require.Zero(t, testutil.ToFloat64(metric(t, reg, "outbox_pending_messages")))
	require.Equal(t, 1.0, testutil.ToFloat64(metric(t, reg, "outbox_dead_messages")))
	require.Zero(t, testutil.ToFloat64(metric(t, reg, "outbox_oldest_pending_age_seconds")))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "metric naming problems")
}

func TestReason(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		outboxrabbitmq.ErrUnroutable: outboxmetrics.ReasonUnroutable,
		outbox.ErrUnroutable:         outboxmetrics.ReasonUnroutable,
		outbox.ErrRefused:            outboxmetrics.ReasonNacked,
		fmt.Errorf("%w (%w)", outboxrabbitmq.ErrNacked, outbox.ErrRefused): outboxmetrics.ReasonNacked, // the publisher's nack
		outbox.Permanent(outbox.ErrTooLarge):                               outboxmetrics.ReasonTooLarge,
		outbox.Permanent(context.Canceled):                                 outboxmetrics.ReasonPermanent,
		outbox.ErrUnavailable:                                              outboxmetrics.ReasonUnavailable,
		context.DeadlineExceeded:                                           outboxmetrics.ReasonOther,
	} {
		require.Equal(t, want, outboxmetrics.Reason(err), "%v", err)
	}
}

// metric returns a collector that reads one metric family's single series from reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered{reg: reg, name: name}
}

type gathered struct {
	reg  *prometheus.Registry
	name string
}

func (g gathered) Describe(chan<- *prometheus.Desc) {}
func (g gathered) Collect(ch chan<- prometheus.Metric) {
	families, _ := g.reg.Gather()
	for _, f := range families {
		if f.GetName() != g.name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.UntypedValue, v)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// TestStatsTables reads the outbox of StatsConfig.Tables, and refuses invalid ones.
func TestStatsTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	tables := outbox.Tables{Schema: "billing"}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return store.Add(ctx, tx, outbox.Message{Exchange: "x", RoutingKey: "k", Type: "T", AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`)})
	}))

	reg := prometheus.NewPedanticRegistry()
	stats, err := outboxmetrics.NewStats(reg, pool, outboxmetrics.StatsConfig{Tables: tables})
	require.NoError(t, err)
	require.NoError(t, stats.Refresh(ctx))
	require.InDelta(t, 1, testutil.ToFloat64(metric(t, reg, "outbox_pending_messages")), 0, "the row in billing, not the default table's none")

	_, err = outboxmetrics.NewStats(prometheus.NewPedanticRegistry(), pool, outboxmetrics.StatsConfig{Tables: outbox.Tables{Messages: "a\x00b"}})
	require.ErrorIs(t, err, outbox.ErrInvalidTables)
}

// TestStatsPartitioned: on a partitioned table, outbox_partitions_ahead_seconds says how far
// ahead its partitions reach; a plain table has no such metric.
func TestStatsPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	tables := outbox.Tables{Messages: "hourly", Partition: time.Hour}
	store, err := outbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))

	reg := prometheus.NewPedanticRegistry()
	stats, err := outboxmetrics.NewStats(reg, pool, outboxmetrics.StatsConfig{Tables: tables})
	require.NoError(t, err)
	require.NoError(t, stats.Refresh(ctx))
	ahead := testutil.ToFloat64(metric(t, reg, "outbox_partitions_ahead_seconds"))
	require.Greater(t, ahead, (3*time.Hour - time.Minute).Seconds(), "Migrate made three hours ahead")
	require.LessOrEqual(t, ahead, (4 * time.Hour).Seconds())

	// Every partition gone: writers fail, and the metric says so.
	_, err = pool.Exec(ctx, "DO $$ DECLARE p regclass; BEGIN FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'hourly'::regclass LOOP EXECUTE 'DROP TABLE ' || p; END LOOP; END $$")
	require.NoError(t, err)
	require.NoError(t, stats.Refresh(ctx))
	require.True(t, math.IsInf(testutil.ToFloat64(metric(t, reg, "outbox_partitions_ahead_seconds")), -1))

	plain := prometheus.NewPedanticRegistry()
	require.NoError(t, outbox.Migrate(ctx, pool))
	stats, err = outboxmetrics.NewStats(plain, pool, outboxmetrics.StatsConfig{})
	require.NoError(t, err)
	require.NoError(t, stats.Refresh(ctx))
	families, err := plain.Gather()
	require.NoError(t, err)
	for _, f := range families {
		require.NotEqual(t, "outbox_partitions_ahead_seconds", f.GetName(), "not for a plain table")
	}
}

// TestStatsConfigWithDefaults: the effective config is what NewStats runs with, and a
// negative interval is refused with the field's name rather than panicking a ticker.
func TestStatsConfigWithDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := outboxmetrics.StatsConfig{}.WithDefaults()
	require.NoError(t, err)
	require.Equal(t, outboxmetrics.DefaultStatsInterval, cfg.Interval)
	require.Equal(t, outbox.Tables{}.WithDefaults(), cfg.Tables)
	require.NotNil(t, cfg.Logger)

	_, err = outboxmetrics.StatsConfig{Interval: -time.Second}.WithDefaults()
	require.ErrorContains(t, err, "stats interval must be >= 0")
	_, err = outboxmetrics.NewStats(prometheus.NewPedanticRegistry(), nil, outboxmetrics.StatsConfig{Interval: -time.Second})
	require.ErrorContains(t, err, "stats interval must be >= 0")
	_, err = outboxmetrics.StatsConfig{Tables: outbox.Tables{Messages: "a\x00b"}}.WithDefaults()
	require.ErrorIs(t, err, outbox.ErrInvalidTables)
}

// TestSlotStats reads a slot's state into the outbox_wal_slot_* metrics. The shared server
// runs at wal_level=replica: a physical slot that reserves WAL at once stands in for the WAL
// relay's (pkg/outbox's TestWALRelay/SlotStats reads a logical one).
func TestSlotStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	slot := strings.ToLower(strings.ReplaceAll(testinfra.UniqueName(t, "slot"), "-", "_"))
	_, err := pool.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slot)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	_, err = pool.Exec(ctx, "CREATE TABLE filler AS SELECT generate_series(1, 10000) AS n")
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	stats, err := outboxmetrics.NewStats(reg, pool, outboxmetrics.StatsConfig{Slot: slot})
	require.NoError(t, err)
	require.NoError(t, stats.Refresh(ctx))
	value := func(name string) float64 { return testutil.ToFloat64(metric(t, reg, name)) }
	require.Equal(t, 1.0, value("outbox_wal_slot_exists"))
	require.Zero(t, value("outbox_wal_slot_active"))
	require.Zero(t, value("outbox_wal_slot_lost"))
	require.Greater(t, value("outbox_wal_slot_retained_bytes"), 100_000.0, "the WAL of 10,000 rows since the slot reserved it")
	require.True(t, math.IsInf(value("outbox_wal_slot_safe_bytes"), 1), "max_slot_wal_keep_size sets no limit")
}

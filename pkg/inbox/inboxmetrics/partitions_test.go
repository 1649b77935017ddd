package inboxmetrics_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestPartitions: inbox_partitions_ahead_seconds says how far ahead a partitioned inbox's
// partitions reach, -Inf when none is left; Run keeps it fresh; a plain Tables is refused.
func TestPartitions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testinfra.NewPool(t)
	tables := inbox.Tables{Messages: "hourly", Partition: time.Hour}
	store, err := inbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool))

	reg := prometheus.NewPedanticRegistry()
	p, err := inboxmetrics.NewPartitions(reg, pool, inboxmetrics.PartitionsConfig{Tables: tables, Interval: 50 * time.Millisecond,
		ConstLabels: prometheus.Labels{"service": "test"}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return math.NaN()
	}
	testinfra.Eventually(t, 10*time.Second, func() bool { return gauge("inbox_partitions_ahead_seconds") > 3600 },
		"the partitions Migrate made reach an hour ahead")

	// Every partition gone: messages fail, and the metric says so.
	rows, err := pool.Query(ctx, `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'hourly'::regclass`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, name := range names {
		_, err := pool.Exec(ctx, "DROP TABLE "+name)
		require.NoError(t, err)
	}
	testinfra.Eventually(t, 10*time.Second, func() bool { return math.IsInf(gauge("inbox_partitions_ahead_seconds"), -1) },
		"no partition: -Inf")
	cancel()
	require.NoError(t, <-done)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	_, err = inboxmetrics.NewPartitions(prometheus.NewRegistry(), pool, inboxmetrics.PartitionsConfig{})
	require.ErrorContains(t, err, "not partitioned")
	_, err = inboxmetrics.NewPartitions(prometheus.NewRegistry(), pool, inboxmetrics.PartitionsConfig{Tables: tables, Interval: -time.Second})
	require.ErrorContains(t, err, "interval")
}

package pgxpoolmetrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxshop/outboxshop/internal/pgxpoolmetrics"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestCollector(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(pgxpoolmetrics.New(pool, prometheus.Labels{"service": "test"})); err != nil {
		t.Fatal(err)
	}

	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()

	want := fmt.Sprintf(`
# HELP pgxpool_acquired_conns Connections acquired from the pool (in use).
# TYPE pgxpool_acquired_conns gauge
pgxpool_acquired_conns{service="test"} 1
# HELP pgxpool_acquires_total Successful acquires of a connection from the pool.
# TYPE pgxpool_acquires_total counter
pgxpool_acquires_total{service="test"} %d
# HELP pgxpool_max_conns The largest number of connections the pool opens.
# TYPE pgxpool_max_conns gauge
pgxpool_max_conns{service="test"} %d
# HELP pgxpool_total_conns Connections open in the pool: idle, acquired or being built.
# TYPE pgxpool_total_conns gauge
pgxpool_total_conns{service="test"} %d
`, pool.Stat().AcquireCount(), pool.Stat().MaxConns(), pool.Stat().TotalConns())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"pgxpool_acquired_conns", "pgxpool_acquires_total", "pgxpool_max_conns", "pgxpool_total_conns"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 7 {
		t.Errorf("got %d metrics (%v), want 7", n, err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

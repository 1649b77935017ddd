package metricstest_test

import (
	"slices"
	"testing"

	"github.com/outboxshop/outboxshop/internal/metricstest"
)

func TestParseContract(t *testing.T) {
	t.Parallel()
	md := []byte("# Metrics\n\n## A\n\n| name | type |\n| --- | --- |\n" +
		"| `a_total` | counter | `reason` = `x` |\n" +
		"| `pool_*` | gauges | | `pool_one`, `pool_two_total` |\n" +
		"| `go_*`, `process_*` | | |\n" +
		"| `orders_created_total` | counter |\n" +
		"| `warehouse_releases_total` | counter |\n\n" +
		"## RabbitMQ\n\n| `rabbitmq_x` | |\n")
	c := metricstest.ParseContract(md)
	want := []string{"a_total", "orders_created_total", "pool_one", "pool_two_total", "warehouse_releases_total"}
	if !slices.Equal(c.Names, want) {
		t.Errorf("names %v, want %v", c.Names, want)
	}
	if !slices.Equal(c.Prefixes, []string{"go_", "process_"}) {
		t.Errorf("prefixes %v", c.Prefixes)
	}
	if got := c.For("orders").Names; slices.Contains(got, "warehouse_releases_total") || !slices.Contains(got, "orders_created_total") {
		t.Errorf("For(orders) = %v", got)
	}
}

func TestLoadContract(t *testing.T) {
	t.Parallel()
	c := metricstest.LoadContract(t) // docs/metrics.md of this repository
	for _, n := range []string{"outbox_pending_messages", "inbox_redelivery_window_seconds", "pgxpool_acquire_duration_seconds_total", "warehouse_stock_available"} {
		if !slices.Contains(c.Names, n) {
			t.Errorf("%s missing from %v", n, c.Names)
		}
	}
}

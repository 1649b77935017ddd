package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLongestStall(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }

	t.Run("BetweenCompletions", func(t *testing.T) {
		t.Parallel()
		stall, from := longestStall([]time.Time{at(3), at(1), at(1.5), at(7), at(8)}, at(0), at(9))
		require.Equal(t, 4*time.Second, stall)
		require.Equal(t, at(3), from)
	})
	t.Run("AtTheEdges", func(t *testing.T) {
		t.Parallel()
		stall, from := longestStall([]time.Time{at(6), at(6.5)}, at(0), at(8))
		require.Equal(t, 6*time.Second, stall, "from the start of the window to the first completion")
		require.Equal(t, at(0), from)
		stall, from = longestStall([]time.Time{at(0.5)}, at(0), at(8))
		require.Equal(t, 7500*time.Millisecond, stall, "from the last completion to the end")
		require.Equal(t, at(0.5), from)
	})
	t.Run("OutsideTheWindowIgnored", func(t *testing.T) {
		t.Parallel()
		stall, _ := longestStall([]time.Time{at(-1), at(20)}, at(0), at(5))
		require.Equal(t, 5*time.Second, stall)
	})
}

func TestWatermarkArgs(t *testing.T) {
	t.Parallel()
	args, err := watermarkArgs("0.4\n")
	require.NoError(t, err)
	require.Equal(t, []string{"0.4"}, args)
	args, err = watermarkArgs("{absolute,1073741824}")
	require.NoError(t, err)
	require.Equal(t, []string{"absolute", "1073741824"}, args)
	_, err = watermarkArgs("")
	require.Error(t, err, "never read: clearing must not guess")
	_, err = watermarkArgs("{absolute,lots}")
	require.Error(t, err)
}

func TestFirstLogAfter(t *testing.T) {
	t.Parallel()
	logs := `### chaos: orders-relay incarnation 1 started
{"time":"2026-12-01T10:00:01Z","msg":"outbox relay paused","state":"broker_unavailable"}
{"time":"2026-12-01T10:00:05Z","msg":"outbox relay state","state":"running"}
{"time":"2026-12-01T10:00:09.5Z","msg":"outbox relay paused","state":"broker_unavailable"}
`
	at, ok := firstLogAfter(logs, logBrokerUnavailable, time.Date(2026, 12, 1, 10, 0, 2, 0, time.UTC))
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 12, 1, 10, 0, 9, 500_000_000, time.UTC), at)
	_, ok = firstLogAfter(logs, logBrokerUnavailable, time.Date(2026, 12, 1, 10, 0, 10, 0, time.UTC))
	require.False(t, ok)
}

func TestPoisonRows(t *testing.T) {
	t.Parallel()
	kinds := map[string]bool{}
	for _, p := range poisonRows() {
		require.False(t, kinds[p.kind], "one row per kind: the audit groups the outbox by aggregate and type")
		kinds[p.kind] = true
		exchange, routingKey, typ, payload, headers, err := p.values()
		require.NoError(t, err, p.kind)
		require.NotEmpty(t, exchange)
		require.NotEmpty(t, typ)
		require.NotEmpty(t, payload)
		require.NotEmpty(t, headers)
		if !strings.HasPrefix(routingKey, "chaos.poison.") {
			t.Errorf("%s: routing key %q would reach a service's queue", p.kind, routingKey)
		}
	}
	for _, k := range []string{"routing-key-256", "type-256", "headers-not-strings", "header-key-300", "headers-over-frame-max",
		"payload-over-max-message-bytes", "unknown-exchange", "cc-number"} {
		require.True(t, kinds[k], "the brief's poison %s", k)
	}
	_, rk, _, _, _, _ := poisonRows()[0].values()
	require.Len(t, rk, amqpShortMax+1)
}

func TestScenarioSettings(t *testing.T) {
	t.Parallel()
	for _, s := range Scenarios() {
		for _, kv := range s.Settings {
			name, _, ok := strings.Cut(kv, "=")
			require.True(t, ok, "%s: %q is not NAME=value", s.Name, kv)
			require.True(t, strings.HasPrefix(name, "ORDERS_") || strings.HasPrefix(name, "WAREHOUSE_"),
				"%s: %s names no service", s.Name, name)
		}
	}
	require.Empty(t, unreadSettings([]string{"ORDERS_RELAY_MAX_ATTEMPTS=3", "WAREHOUSE_QUEUE_DELIVERY_LIMIT=2"}))
	require.Equal(t, []string{"WAREHOUSE_NO_SUCH_SETTING=1", "ORDERS_QUEUE_DELIVERY_LIMITS=2"},
		unreadSettings([]string{"WAREHOUSE_NO_SUCH_SETTING=1", "ORDERS_QUEUE_DELIVERY_LIMITS=2", "ORDERS_QUEUE_DELIVERY_LIMIT=2"}))
	require.Empty(t, unreadSettings(nil))
	require.Empty(t, unreadSettings([]string{"WAREHOUSE_HTTP_ADDR=1"}))
	require.Equal(t, []string{"ORDERS_WAREHOUSE_HTTP_ADDR=1"}, unreadSettings([]string{"ORDERS_WAREHOUSE_HTTP_ADDR=1"}),
		"a warehouse name under the orders prefix is read by nobody")
}

func TestReplicas(t *testing.T) {
	t.Parallel()
	require.Equal(t, OrdersRelay, Replica(OrdersRelay, 1))
	require.Equal(t, Service("orders-relay-2"), Replica(OrdersRelay, 2))
	require.Equal(t, OrdersRelay, baseService("orders-relay-2"))
	require.Equal(t, OrdersRelay, baseService(OrdersRelay))
	require.Equal(t, Warehouse, baseService("warehouse-12"))
	require.Equal(t, WarehouseRelay, baseService(WarehouseRelay), "warehouse-relay is a service, not a replica of warehouse")
	require.Equal(t, []Service{Warehouse, OrdersAPI, WarehouseRelay, OrdersRelay, "orders-relay-2", "orders-relay-3"},
		ShopSpec{Replicas: map[Service]int{OrdersRelay: 3}}.Processes())
	require.Equal(t, Services, ShopSpec{}.Processes())
	require.Equal(t, Service("orders-relay-2"), relayOf("orders-relay-2", OrdersRelay))
	require.Equal(t, OrdersRelay, relayOf(OrdersAPI, OrdersRelay))
}

package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientProcess(t *testing.T) {
	for client, want := range map[string]Service{
		"orders-relay":               OrdersRelay,
		"orders-relay-2":             "",
		"warehouse-relay":            WarehouseRelay,
		"outboxshop inbox warehouse": Warehouse,
		"outboxshop inbox orders":    OrdersAPI,
		"(unnamed)":                  "",
		"chaos observer":             "",
	} {
		got, ok := clientProcess(client)
		require.Equal(t, want != "", ok, client)
		require.Equal(t, want, got, client)
	}
}

func TestNodeAddr(t *testing.T) {
	eps := Endpoints{
		BrokerNodes: []string{"rabbit@broker-1", "rabbit@broker-2"},
		AMQPURLs:    []string{"amqp://guest:guest@10.1.2.3:5672/", "amqp://guest:guest@10.1.2.4:5672/"},
	}
	addr, err := nodeAddr(eps, "rabbit@broker-2")
	require.NoError(t, err)
	require.Equal(t, "10.1.2.4:5672", addr)
	_, err = nodeAddr(eps, "rabbit@broker-3")
	require.ErrorContains(t, err, "no URL for broker node rabbit@broker-3")
}

func TestShopLabResolve(t *testing.T) {
	lab := &shopLab{net: &netLab{hosts: map[string]*netHost{
		"broker-1": {Name: "broker-1"}, "orders-db": {Name: "orders-db"}, "orders-relay": {Name: "orders-relay"},
	}}, nodes: map[string]string{"rabbit@broker-1": "broker-1"}}
	got, err := lab.resolve([]string{"rabbit@broker-1", "orders-db", "orders-relay"})
	require.NoError(t, err)
	require.Equal(t, []string{"broker-1", "orders-db", "orders-relay"}, got, "node names map to their hosts")
	_, err = lab.resolve([]string{"orders-relay", "warehouse"})
	require.ErrorContains(t, err, `no host "warehouse" in the network lab`)

	l := &Local{shop: &localShop{lab: lab}}
	err = l.Partition(t.Context(), []string{"orders-db"}, []string{"orders-relay", "orders-db"}, true)
	require.ErrorContains(t, err, "two sets of hosts, none in both")
	err = l.Partition(t.Context(), nil, []string{"orders-relay"}, true)
	require.ErrorContains(t, err, "two sets of hosts, none in both")

	_, err = (&Local{}).shopLab()
	require.ErrorIs(t, err, ErrUnsupported, "a shop without a lab")
}

func TestPrimaryCutOff(t *testing.T) {
	lab := &shopLab{net: &netLab{}}
	l := &Local{shop: &localShop{lab: lab, order: []Service{OrdersAPI, OrdersRelay}}}
	cut := func(pairs ...[2]string) {
		lab.cut = map[[2]string]bool{}
		for _, p := range pairs {
			lab.cut[p] = true
		}
	}
	both := func(a, b string) [][2]string { return [][2]string{{a, b}, {b, a}} }
	var all [][2]string
	for _, peer := range []string{HostOrdersStandby, string(OrdersAPI), string(OrdersRelay)} {
		all = append(all, both(HostOrdersPrimary, peer)...)
	}

	cut(all...)
	require.True(t, l.primaryCutOff(), "cut from its standby and from every process, both ways")
	cut(both(HostOrdersPrimary, HostOrdersStandby)...)
	require.False(t, l.primaryCutOff(), "cut from its standby alone: the processes still write to it")
	cut(all[1:]...)
	require.False(t, l.primaryCutOff(), "one way only to the standby")
	cut(all[:len(all)-1]...)
	require.False(t, l.primaryCutOff(), "a process still hears it")
	lab.cut = nil
	require.False(t, l.primaryCutOff(), "healed")
	require.False(t, (&Local{}).primaryCutOff(), "no lab")
}

func TestUnconsumed(t *testing.T) {
	confirmed := map[string]string{"a": "OrderCreated", "b": "OrderCreated", "c": "OrderCancelled", "d": "Audit"}
	consumed := map[string]string{"a": "OrderCreated", "c": "OrderCancelled", "x": "OrderCreated"}
	missing, checked := unconsumed(confirmed, consumed)
	require.Equal(t, 3, checked, "Audit is a type the consumer takes none of: not routed to it")
	require.Equal(t, map[string][]string{"OrderCreated": {"b"}}, missing)

	missing, checked = unconsumed(confirmed, map[string]string{"a": "OrderCreated", "b": "OrderCreated", "c": "OrderCancelled"})
	require.Equal(t, 3, checked)
	require.Empty(t, missing)
}

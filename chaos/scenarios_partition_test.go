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

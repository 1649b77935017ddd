package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPickClientNode(t *testing.T) {
	t.Parallel()

	t.Run("TheNodeWithARelayAndAConsumer", func(t *testing.T) {
		t.Parallel()
		node, clients := pickClientNode([]BrokerNodeState{
			{Node: "a", Clients: []string{"(unnamed)", "orders-relay", "warehouse-relay"}},
			{Node: "b", Clients: []string{"outboxshop inbox orders", "warehouse-relay"}},
			{Node: "c"},
		})
		require.Equal(t, "b", node)
		require.Equal(t, []string{"outboxshop inbox orders", "warehouse-relay"}, clients)
	})

	t.Run("ElseTheOneWithTheMostShopClients", func(t *testing.T) {
		t.Parallel()
		node, clients := pickClientNode([]BrokerNodeState{
			{Node: "a", Clients: []string{"(unnamed)", "outboxshop topology warehouse.orders", "orders-relay"}},
			{Node: "b", Clients: []string{"outboxshop inbox orders", "outboxshop inbox warehouse"}},
		})
		require.Equal(t, "b", node)
		require.False(t, hasRelayAndConsumer(clients))
	})

	t.Run("NoneWithoutShopClients", func(t *testing.T) {
		t.Parallel()
		node, _ := pickClientNode([]BrokerNodeState{{Node: "a", Clients: []string{"(unnamed)"}}, {Node: "b"}})
		require.Empty(t, node)
	})
}

func TestClientName(t *testing.T) {
	t.Parallel()
	for _, props := range []string{
		`{"product":"AMQP 0.9.1 Client","connection_name":"orders-relay"}`,
		`[["product","longstr","AMQP 0.9.1 Client"],["connection_name","longstr","orders-relay"]]`,
	} {
		m := clientName.FindStringSubmatch(props)
		require.NotNil(t, m, props)
		require.Equal(t, "orders-relay", m[1])
	}
}

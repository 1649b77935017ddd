package events_test

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/events"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func TestHeaderStandsAtTheTopLevel(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0190a8f2-5b1c-7d3e-8f4a-123456789abc")
	body, err := json.Marshal(struct {
		events.Header
		Reason string `json:"reason"`
	}{events.NewHeader(id), "unknown_sku"})
	require.NoError(t, err)
	require.JSONEq(t, `{"version": 1, "order_id": "0190a8f2-5b1c-7d3e-8f4a-123456789abc", "reason": "unknown_sku"}`, string(body))
}

func TestMessage(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0190a8f2-5b1c-7d3e-8f4a-123456789abc")

	t.Run("an event about an order, with the saga's ids", func(t *testing.T) {
		t.Parallel()
		m, err := events.Message("shop.events", "stock.reserved", "StockReserved", id,
			events.Meta{CorrelationID: "req-1", CausationID: "msg-1"}, events.NewHeader(id))
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), m.ID.Version())
		require.NoError(t, m.Validate())
		m.ID = uuid.Nil
		require.Equal(t, outbox.Message{
			Exchange: "shop.events", RoutingKey: "stock.reserved", Type: "StockReserved",
			AggregateType: "order", AggregateID: id.String(),
			Payload: []byte(`{"version":1,"order_id":"0190a8f2-5b1c-7d3e-8f4a-123456789abc"}`),
			Headers: map[string]string{outbox.HeaderCorrelationID: "req-1", outbox.HeaderCausationID: "msg-1"},
		}, m)
	})

	t.Run("ids that are not set are no headers", func(t *testing.T) {
		t.Parallel()
		m, err := events.Message("shop.events", "order.created", "OrderCreated", id, events.Meta{}, events.NewHeader(id))
		require.NoError(t, err)
		require.Empty(t, m.Headers)
	})

	t.Run("a body that does not encode", func(t *testing.T) {
		t.Parallel()
		_, err := events.Message("shop.events", "order.created", "OrderCreated", id, events.Meta{}, func() {})
		require.ErrorContains(t, err, "encode OrderCreated")
	})
}

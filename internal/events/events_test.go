package events_test

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/events"
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

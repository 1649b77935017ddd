package outboxrabbitmq

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// BenchmarkPublishing measures the pure-Go conversion of an outbox message (a ~1 KiB
// payload and the three well-known headers) into the AMQP publishing the relay sends: the
// publisher's CPU cost per message before the wire.
func BenchmarkPublishing(b *testing.B) {
	m := outbox.Message{
		ID:            uuid.Must(uuid.NewV7()),
		Exchange:      "shop.events",
		RoutingKey:    "order.created",
		Type:          "OrderCreated",
		AggregateType: "order",
		AggregateID:   uuid.NewString(),
		Payload:       json.RawMessage(`{"version":1,"note":"` + strings.Repeat("x", 1000) + `"}`),
		Headers: map[string]string{
			outbox.HeaderCorrelationID: uuid.NewString(),
			outbox.HeaderCausationID:   uuid.NewString(),
			outbox.HeaderTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
		CreatedAt: time.Now(),
	}
	b.ReportAllocs()
	var p int
	for b.Loop() {
		p += len(publishing(m).Headers)
	}
	if p == 0 {
		b.Fatal("no headers")
	}
}

package outboxrabbitmq_test

import (
	"log"
	"log/slog"

	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// A publisher given the nodes of a three-node cluster.
func ExampleConfig_cluster() {
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		// Tried round-robin from a random node; a failed node costs one refused dial.
		URLs: []string{
			"amqp://shop:secret@rabbitmq-0.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-1.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-2.rabbitmq:5672/",
		},
		Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
			slog.Info("broker connection", "up", c.Up, "broker", c.Broker) // host:port, never the password
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
}

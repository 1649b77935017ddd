package rabbitmq_test

import (
	"log"
	"log/slog"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox/rabbitmq"
)

// A publisher given the nodes of a three-node cluster.
func ExampleConfig_cluster() {
	pub, err := rabbitmq.New(rabbitmq.Config{
		// Tried round-robin from a random node; a failed node costs one refused dial.
		URLs: []string{
			"amqp://shop:secret@rabbitmq-0.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-1.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-2.rabbitmq:5672/",
		},
		Hooks: rabbitmq.Hooks{Connected: func(c rabbitmq.ConnectionChange) {
			slog.Info("broker connection", "up", c.Up, "broker", c.Broker) // host:port, never the password
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
}

// A connection of your own to RabbitMQ, publishing with amqp091-go, whose socket batches
// writes as the Publisher's do: one write(2) for the frames of several publishes.
func ExampleBatchWrites() {
	conn, err := amqp.DialConfig("amqp://guest:guest@localhost:5672/", amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(30*time.Second)(network, addr)
			if err != nil {
				return nil, err
			}
			return rabbitmq.BatchWrites(c), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

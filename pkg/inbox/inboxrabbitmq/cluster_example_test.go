package inboxrabbitmq_test

import (
	"context"
	"log"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// A consumer given the nodes of a three-node cluster.
func ExampleConfig_cluster() {
	var pool *pgxpool.Pool // the application's
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		// Tried round-robin from a random node; a failed node costs one refused dial.
		URLs: []string{
			"amqp://shop:secret@rabbitmq-0.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-1.rabbitmq:5672/",
			"amqp://shop:secret@rabbitmq-2.rabbitmq:5672/",
		},
		Queue: "billing.orders", Name: "billing", DeadLetterExchange: "dead",
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error { return nil },
		Hooks: inboxrabbitmq.Hooks{Connected: func(c inboxrabbitmq.ConnectionChange) {
			slog.Info("broker connection", "up", c.Up, "broker", c.Broker) // host:port, never the password
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = consumer // consumer.Run(ctx), as in Example_service
}

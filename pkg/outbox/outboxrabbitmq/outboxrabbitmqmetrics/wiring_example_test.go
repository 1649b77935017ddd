package outboxrabbitmqmetrics_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// A relay process wires both halves of its metrics: the relay's own (outboxmetrics.Relay, through
// the relay's Hooks, and its pool sizing) and the RabbitMQ publisher's connection
// (outboxrabbitmqmetrics.Publisher, through the publisher's Hooks), on one registry it serves.
func Example_relayProcess() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"service": "orders"}
	relayMetrics, err := outboxmetrics.NewRelay(reg, labels)
	if err != nil {
		log.Fatal(err)
	}
	pubMetrics, err := outboxrabbitmqmetrics.NewPublisher(reg, labels)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: os.Getenv("AMQP_URL"), Hooks: pubMetrics.Hooks(outboxrabbitmq.Hooks{})})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{Hooks: relayMetrics.Hooks(outbox.Hooks{})})
	if err != nil {
		log.Fatal(err)
	}
	relayMetrics.SetPoolSize(relay.PoolSize()) // outbox_pool_shortfall_connections
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

package inboxrabbitmqmetrics_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
)

// A consumer process wires both halves of its metrics: the RabbitMQ consumer's
// (inboxrabbitmqmetrics.Consumer, through the consumer's Hooks, and its pool sizing) and the
// inbox's own (inboxmetrics.Window: retention beside the redelivery window), on one registry it
// serves.
func Example_consumerProcess() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"service": "billing"}
	consumerMetrics, err := inboxrabbitmqmetrics.NewConsumer(reg, inboxrabbitmqmetrics.Config{
		KnownTypes: []string{"order.placed"}, ConstLabels: labels,
	})
	if err != nil {
		log.Fatal(err)
	}
	window, err := inboxmetrics.NewWindow(reg, labels)
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL: os.Getenv("AMQP_URL"), Queue: "billing.orders", Name: "billing",
		Hooks: consumerMetrics.Hooks(inboxrabbitmq.Hooks{}), // pass your own hooks in; they still run
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	consumerMetrics.SetPoolSize("billing", consumer.PoolSize()) // inbox_pool_shortfall_connections
	window.Set("billing", inbox.DefaultCleanupRetention,
		inboxmetrics.RetryWindow(inboxrabbitmq.DefaultMaxDeliveries, inboxrabbitmq.DefaultRetryBaseDelay, inboxrabbitmq.DefaultRetryMaxDelay))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	if err := consumer.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

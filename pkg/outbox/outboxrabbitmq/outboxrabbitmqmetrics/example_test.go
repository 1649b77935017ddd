package outboxrabbitmqmetrics_test

import (
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// A relay process registers the relay's broker-neutral metrics and its RabbitMQ publisher's
// on one registry, with the same constant labels.
func ExamplePublisher_Hooks() {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"service": "orders"}
	if _, err := outboxmetrics.NewRelay(reg, labels); err != nil {
		log.Fatal(err)
	}
	pubMetrics, err := outboxrabbitmqmetrics.NewPublisher(reg, labels)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URL:   "amqp://guest:guest@localhost:5672/",
		Hooks: pubMetrics.Hooks(outboxrabbitmq.Hooks{}), // pass your own hooks in; they still run
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "outbox_broker_connected" {
			fmt.Println(f.GetName(), f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output: outbox_broker_connected 0
}

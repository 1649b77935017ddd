package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// Tracing: Add records the caller's trace context in the row, and the relay publishes the
// message under a publish span in that same trace, whenever it runs.
func Example_tracing() {
	ctx := context.Background()
	pool, amqpURL, cleanup := exampleEnv()
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	// Once, at start-up: the W3C propagators (Add uses the global one) and a tracer
	// provider. This one records in memory; a service exports its spans (OTLP, say).
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	// A request's span: Add records its context in the row's headers.
	reqCtx, request := tp.Tracer("shop").Start(ctx, "POST /orders")
	err := pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error {
		return outbox.Add(reqCtx, tx, outbox.Message{
			Exchange:      "example.events",
			RoutingKey:    "order.created",
			Type:          "OrderCreated",
			AggregateType: "order",
			AggregateID:   "order-1",
			Payload:       json.RawMessage(`{"order_id":"order-1"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	request.End()

	// The relay makes its spans with the provider of its Config (nil: the global one).
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URL: amqpURL,
		Setup: func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare("example.events", "topic", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare("example.orders", false, true, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind("example.orders", "order.#", "example.events", false, nil)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.PublishBatch(ctx); err != nil {
		log.Fatal(err)
	}
	for _, s := range spans.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			fmt.Println(s.Name(), "- child of the request:", s.Parent().SpanID() == request.SpanContext().SpanID(),
				"- status:", s.Status().Code)
		}
	}
	// Output:
	// publish example.events - child of the request: true - status: Unset
}

// A store whose Add records the trace context through a propagator of its own rather than the
// global one; the relay reads it back with the same one.
func ExampleStore_WithPropagator() {
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	store, err := outbox.NewStore(outbox.Tables{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	store = store.WithPropagator(w3c)
	cfg := outbox.Config{Tables: store.Tables(), Propagator: w3c}
	fmt.Println(cfg.Tables.Schema)
	// Output:
	// billing
}

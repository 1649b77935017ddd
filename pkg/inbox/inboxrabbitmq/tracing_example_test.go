package inboxrabbitmq_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// Tracing: each delivery is handled under a process span, a child of the trace context in
// its headers (an outbox relay's publish span puts its own there). The handler's ctx
// carries the process span, so the handler's spans nest under it; a duplicate's span says
// so and has no children.
func Example_tracing() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, drop := exampleDatabase(ctx)
	defer drop()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	amqpURL, queue := exampleBroker()

	// A tracer provider that records in memory; a service exports its spans (OTLP, say).
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

	processed := make(chan struct{}, 2)
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                  amqpURL,
		Queue:                queue,
		Name:                 "orders-projection",
		DeadLetterRoutingKey: queue,
		Setup: func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(queue, false, true, false, false, nil)
			return err
		},
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			_, span := tp.Tracer("projection").Start(ctx, "project order") // under the process span
			defer span.End()
			return nil
		},
		Concurrency:    1,
		TracerProvider: tp,  // nil: the global provider
		Propagator:     w3c, // nil: the global propagator
		Hooks: inboxrabbitmq.Hooks{
			Processed: func(inboxrabbitmq.ProcessedMessage) { processed <- struct{}{} },
		},
	})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()

	// A producer publishes the same event twice, with the context of its span.
	pubCtx, producer := tp.Tracer("shop").Start(ctx, "publish", trace.WithSpanKind(trace.SpanKindProducer))
	headers := propagation.MapCarrier{}
	w3c.Inject(pubCtx, headers)
	producer.End()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		panic(err)
	}
	for range 2 {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId:   "order-42-placed",
			Type:        "order.placed",
			ContentType: "application/json",
			Headers:     amqp.Table{"traceparent": headers["traceparent"]},
			Body:        []byte(`{"id":"order-42"}`),
		}); err != nil {
			panic(err)
		}
	}
	<-processed
	<-processed
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	for _, s := range spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		var outcome string
		for _, kv := range s.Attributes() {
			if kv.Key == inboxrabbitmq.AttrOutcome {
				outcome = kv.Value.AsString()
			}
		}
		fmt.Println("process span, child of the producer:", s.Parent().SpanID() == producer.SpanContext().SpanID(), "- outcome:", outcome)
	}
	// Output:
	// process span, child of the producer: true - outcome: processed
	// process span, child of the producer: true - outcome: duplicate
}

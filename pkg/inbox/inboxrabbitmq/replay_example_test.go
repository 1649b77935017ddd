package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// Replaying dead letters once their handler is fixed: a dry run first, to see what the
// dead-letter queue holds, then the replay of those that the fix is for. The others stay.
func ExampleReplayDeadLetters() {
	ctx := context.Background()
	amqpURL, queue := exampleBroker()
	deadQueue := queue + ".dead"
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	exampleDeadLetters(ctx, conn, queue, deadQueue) // three dead letters, as a consumer of queue leaves them

	// What is there, and why: a dry run moves nothing.
	report, err := inboxrabbitmq.ReplayDeadLetters(ctx, conn, inboxrabbitmq.ReplayConfig{Queue: deadQueue, DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range report.Groups {
		fmt.Printf("%d %s: %s\n", g.Examined, g.Type, g.Reason)
	}

	// The handler of version 2 was deployed: replay those, into the queue each came from.
	report, err = inboxrabbitmq.ReplayDeadLetters(ctx, conn, inboxrabbitmq.ReplayConfig{
		Queue: deadQueue,
		Match: func(m inboxrabbitmq.DeadLetterMessage) bool {
			return strings.Contains(m.Reason, "version 2 is not supported")
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replayed %d of %d dead letters, %d left\n", report.Replayed, report.Examined, report.Left)

	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	d, _, err := ch.Get(queue, true)
	if err != nil {
		panic(err)
	}
	fmt.Println(queue == d.Headers[inboxrabbitmq.HeaderOriginalQueue], d.MessageId)
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(deadQueue, false, false, false)
	// Output:
	// 1 order.cancelled: malformed-json
	// 2 order.placed: permanent-error
	// replayed 2 of 3 dead letters, 1 left
	// true order-1
}

// exampleDeadLetters declares queue and deadQueue, and puts into deadQueue three dead letters
// from queue, as the consumer publishes them.
func exampleDeadLetters(ctx context.Context, conn *amqp.Connection, queue, deadQueue string) {
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	for _, q := range []string{queue, deadQueue} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			panic(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	for _, m := range []struct{ id, typ, reason string }{
		{"order-1", "order.placed", "permanent-error: order.placed version 2 is not supported (1 is)"},
		{"order-2", "order.cancelled", "malformed-json: body is not valid JSON"},
		{"order-3", "order.placed", "permanent-error: order.placed version 2 is not supported (1 is)"},
	} {
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", deadQueue, false, false, amqp.Publishing{
			MessageId: m.id, Type: m.typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Body: []byte(`{"version":2,"order_id":"` + m.id + `"}`),
			Headers: amqp.Table{
				inboxrabbitmq.HeaderDeadReason:         m.reason,
				inboxrabbitmq.HeaderOriginalQueue:      queue,
				inboxrabbitmq.HeaderOriginalExchange:   "shop.events",
				inboxrabbitmq.HeaderOriginalRoutingKey: m.typ,
			},
		})
		if err != nil {
			panic(err)
		}
		if !confirm.Wait() {
			panic("dead letter not confirmed")
		}
	}
}

package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
)

// A consumer that projects order.placed events into an orders table. The same event arrives
// twice; the second delivery is recognised by the inbox and only acknowledged.
func ExampleNewConsumer() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, drop := exampleDatabase(ctx) // a throwaway database for this example
	defer drop()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}
	amqpURL, queue := exampleBroker()
	deadQueue := queue + ".dead"

	processed := make(chan string, 2)
	consumer, err := rabbitmq.NewConsumer(pool, rabbitmq.Config{
		URL:   amqpURL,
		Queue: queue,
		Name:  "orders-projection",
		// Dead letters go through the default exchange straight into the dead-letter queue.
		DeadLetterRoutingKey: deadQueue,
		Setup: func(ch *amqp.Channel) error {
			if _, err := ch.QueueDeclare(deadQueue, true, false, false, false, nil); err != nil {
				return err
			}
			_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
			return err
		},
		Handler: func(ctx context.Context, tx pgx.Tx, d rabbitmq.Delivery) error {
			var order struct {
				ID         string `json:"id"`
				TotalCents int64  `json:"total_cents"`
			}
			if err := json.Unmarshal(d.Body, &order); err != nil {
				return inbox.Permanent(err) // retrying cannot fix the payload
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, order.ID, order.TotalCents)
			return err
		},
		Concurrency: 1, // one message at a time, so this example prints in a fixed order
		Hooks: rabbitmq.Hooks{
			Processed: func(_, msgType string, duplicate bool, _ time.Duration) {
				processed <- fmt.Sprintf("%s duplicate=%v", msgType, duplicate)
			},
		},
	})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()

	// A producer (normally an outbox relay) publishes the same event twice.
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		panic(err)
	}
	for range 2 {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId:    "order-42-placed",
			Type:         "order.placed",
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         []byte(`{"id":"order-42","total_cents":1999}`),
		}); err != nil {
			panic(err)
		}
	}
	fmt.Println(<-processed)
	fmt.Println(<-processed)

	cancel() // stops the consumer gracefully
	if err := <-done; err != nil {
		panic(err)
	}
	var orders int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		panic(err)
	}
	fmt.Println("orders:", orders)
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(deadQueue, false, false, false)
	// Output:
	// order.placed duplicate=false
	// order.placed duplicate=true
	// orders: 1
}

// exampleBroker returns the broker named by OUTBOXSHOP_TEST_AMQP_URL and a queue name no
// other run uses.
func exampleBroker() (amqpURL, queue string) {
	amqpURL = os.Getenv("OUTBOXSHOP_TEST_AMQP_URL") // set by TestMain (testinfra.Main)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return amqpURL, "example.orders." + hex.EncodeToString(b)
}

// exampleDatabase creates an empty database on the server named by
// OUTBOXSHOP_TEST_POSTGRES_URL and returns a pool on it and a function that drops it.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	admin := os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL") // set by TestMain (testinfra.Main)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "inbox_example_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		panic(err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			panic(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			panic(err)
		}
	}
}

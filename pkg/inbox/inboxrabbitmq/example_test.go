package inboxrabbitmq_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
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
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
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
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
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
		Hooks: inboxrabbitmq.Hooks{
			Processed: func(p inboxrabbitmq.ProcessedMessage) {
				processed <- fmt.Sprintf("%s duplicate=%v", p.Type, p.Duplicate)
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

// A service's wiring: the schema at start-up, a consumer with its topology and dead-letter
// queue, cleanup, and a readiness probe. Compiled only: it needs the service's own database
// and broker (pkg/inbox/README.md shows it).
func Example_service() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	amqpURL := os.Getenv("AMQP_URL")

	if err := inbox.Migrate(ctx, pool); err != nil { // or apply inbox.Migrations with goose or golang-migrate
		log.Fatal(err)
	}
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL: amqpURL, Queue: "billing.orders", Name: "billing",
		DeadLetterExchange: "dead", DeadLetterRoutingKey: "billing.orders",
		ContentTypes: []string{"application/json"}, Types: []string{"order.placed"},
		Setup: func(ch *amqp.Channel) error { // on every (re)connect; the dead-letter side first
			if err := ch.ExchangeDeclare("dead", "direct", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare("billing.orders.dead", true, false, false, false,
				amqp.Table{"x-queue-type": "quorum"}); err != nil {
				return err
			}
			if err := ch.QueueBind("billing.orders.dead", "billing.orders", "dead", false, nil); err != nil {
				return err
			}
			if err := ch.ExchangeDeclare("shop.events", "topic", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare("billing.orders", true, false, false, false, amqp.Table{
				"x-queue-type":              "quorum",
				"x-dead-letter-exchange":    "dead",
				"x-dead-letter-routing-key": "billing.orders",
			}); err != nil {
				return err
			}
			return ch.QueueBind("billing.orders", "order.placed", "shop.events", false, nil)
		},
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			var order struct {
				ID         string `json:"id"`
				TotalCents int64  `json:"total_cents"`
			}
			if err := json.Unmarshal(d.Body, &order); err != nil {
				return inbox.Permanent(err) // no retry can fix it: dead-lettered at once
			}
			// Write through tx only. Wrap the error of a dependency that is down with
			// inbox.Transient: the message is held and retried without counting an attempt.
			_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)",
				order.ID, order.TotalCents)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		// An error once the broker has been gone for longer than 30s.
		if err := consumer.Ready(30 * time.Second); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	errc := make(chan error, 2)
	go func() { errc <- consumer.Run(ctx) }() // returns nil when ctx ends
	go func() {
		errc <- inbox.RunCleanup(ctx, pool, inbox.CleanupConfig{Retention: 14 * 24 * time.Hour})
	}()
	for range 2 {
		if err := <-errc; err != nil {
			log.Fatal(err)
		}
	}
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

// WithDefaults shows the configuration a consumer will use: here, the defaults of the fields
// left zero, and Concurrency following Prefetch.
func ExampleConfig_WithDefaults() {
	cfg, err := inboxrabbitmq.Config{
		URL: "amqp://guest:guest@localhost:5672/", Queue: "orders", Name: "orders-projection",
		DeadLetterExchange: "dead", Prefetch: 8,
		Handler: func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil },
	}.WithDefaults()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("concurrency:", cfg.Concurrency, "max deliveries:", cfg.MaxDeliveries)
	fmt.Println("retries:", cfg.RetryBaseDelay, "to", cfg.RetryMaxDelay, "held at most", cfg.MaxHold)
	fmt.Println("reconnects:", cfg.OutageBaseDelay, "to", cfg.OutageMaxDelay)
	// Output:
	// concurrency: 8 max deliveries: 5
	// retries: 1s to 30s held at most 15m0s
	// reconnects: 500ms to 30s
}

// Example_tls consumes from a broker and into a database that take TLS alone, with a
// private CA and a client certificate: the pool as its URL says it (sslmode=verify-full,
// sslrootcert, sslcert, sslkey), the consumer with a tls.Config, for what an amqps:// URL
// cannot say. It has no Output: it needs the servers and the files.
func Example_tls() {
	ctx := context.Background()
	roots := x509.NewCertPool()
	ca, err := os.ReadFile("/etc/inbox/tls/ca.crt")
	if err != nil || !roots.AppendCertsFromPEM(ca) {
		log.Fatal("no CA certificate: ", err)
	}
	cert, err := tls.LoadX509KeyPair("/etc/inbox/tls/consumer.crt", "/etc/inbox/tls/consumer.key")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, "postgres://billing@db.internal:5432/billing?sslmode=verify-full&sslrootcert=/etc/inbox/tls/ca.crt"+
		"&sslcert=/etc/inbox/tls/consumer.crt&sslkey=/etc/inbox/tls/consumer.key")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                "amqps://billing:secret@mq.internal:5671/",
		TLSClientConfig:    &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Queue:              "billing.orders",
		Name:               "billing",
		DeadLetterExchange: "shop.dlx",
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, d.ID)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}

package outbox_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io/fs"
	"log"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// Placing an order: the order row and its OrderCreated event commit together, and a relay
// publishes the event to RabbitMQ.
func Example() {
	ctx := context.Background()
	pool, amqpURL, cleanup := exampleEnv()
	defer cleanup()

	// Once, at start-up.
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	// The business transaction writes the order and its event.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, status) VALUES ($1, 'PENDING')", "order-1"); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, outbox.Message{
			Exchange:      "example.events",
			RoutingKey:    "order.created",
			Type:          "OrderCreated",
			AggregateType: "order",
			AggregateID:   "order-1",
			Payload:       json.RawMessage(`{"order_id":"order-1"}`),
			Headers:       map[string]string{outbox.HeaderCorrelationID: "req-42"},
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	// The relay, in this process or another one.
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URL: amqpURL,
		Setup: func(ch *amqp.Channel) error { // declared on every (re)connect
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
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{
		Hooks: outbox.Hooks{BatchDone: func(b outbox.BatchResult) {
			for _, m := range b.Published {
				fmt.Println("published", m.Type, "for", m.AggregateID)
			}
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(runCtx) }()
	for {
		s, err := outbox.ReadStats(ctx, pool)
		if err != nil {
			log.Fatal(err)
		}
		if s.Pending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// published OrderCreated for order-1
}

// An outbox of your own naming: the payments service keeps its outbox in schema billing, as
// payments_outbox, beside other outboxes in the same database. Migrate creates the schema;
// the relay follows the store's tables, notifications included.
func ExampleStore() {
	ctx := context.Background()
	pool, amqpURL, cleanup := exampleEnv()
	defer cleanup()

	payments, err := outbox.NewStore(outbox.Tables{Schema: "billing", Messages: "payments_outbox"})
	if err != nil {
		log.Fatal(err) // wraps outbox.ErrInvalidTables
	}
	if err := payments.Migrate(ctx, pool); err != nil { // once, at start-up
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return payments.Add(ctx, tx, outbox.Message{
			Exchange: "example.events", RoutingKey: "payment.captured", Type: "PaymentCaptured",
			AggregateType: "payment", AggregateID: "pay-7", Payload: json.RawMessage(`{"payment_id":"pay-7"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{
		URL: amqpURL,
		Setup: func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare("example.events", "topic", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare("example.payments", false, true, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind("example.payments", "payment.#", "example.events", false, nil)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{Tables: payments.Tables()})
	if err != nil {
		log.Fatal(err)
	}
	for {
		n, err := relay.PublishBatch(ctx) // in a service: relay.Run(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	s, err := payments.ReadStats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(payments.Tables(), "pending:", s.Pending)
	// Output:
	// "billing"."payments_outbox" pending: 0
}

// A service on database/sql (here through pgx's stdlib driver) writes its events with AddSQL
// in its own transaction: the same rows as Add's, which the relay publishes alike.
func ExampleAddSQL() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool) // or sql.Open("pgx", databaseURL)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE invoices (id text PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // after a commit it does nothing
	if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (id) VALUES ($1)", "inv-9"); err != nil {
		log.Fatal(err)
	}
	err = outbox.AddSQL(ctx, tx, outbox.Message{
		Exchange: "example.events", RoutingKey: "invoice.issued", Type: "InvoiceIssued",
		AggregateType: "invoice", AggregateID: "inv-9", Payload: json.RawMessage(`{"invoice_id":"inv-9"}`),
	})
	if err != nil {
		log.Fatal(err) // wraps outbox.ErrInvalidMessage for a message it refuses
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	s, err := outbox.ReadStats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", s.Pending)
	// Output:
	// pending: 1
}

// A handler that already sends its statements in one round trip (a pgx.Batch) queues its
// events on the same batch with QueueAdd: the change and the event travel together, one
// round trip, and commit together.
func ExampleQueueAdd() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE shipments (id text PRIMARY KEY, order_id text)"); err != nil {
		log.Fatal(err)
	}

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue("INSERT INTO shipments (id, order_id) VALUES ($1, $2)", "ship-7", "order-1")
		err := outbox.QueueAdd(ctx, &b, outbox.Message{
			Exchange: "example.events", RoutingKey: "shipment.created", Type: "ShipmentCreated",
			AggregateType: "shipment", AggregateID: "ship-7", Payload: json.RawMessage(`{"shipment_id":"ship-7"}`),
		})
		if err != nil {
			return err // wraps outbox.ErrInvalidMessage; nothing was queued
		}
		// One result per queued statement, in order: the shipment's, then the event's.
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		log.Fatal(err)
	}

	s, err := outbox.ReadStats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", s.Pending)
	// Output:
	// pending: 1
}

// Cleanup keeps the table small: published rows older than the retention go, in batches.
func ExampleCleanup() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	deleted, err := outbox.Cleanup(ctx, pool, outbox.CleanupConfig{Retention: 7 * 24 * time.Hour, BatchSize: 1000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", deleted)
	// Output:
	// deleted 0
}

// A partitioned outbox: one partition per hour, which Migrate makes for the next hours and
// Cleanup then keeps ahead; Cleanup drops whole the partitions past the retention that hold
// no pending or dead row. The relay, Add and the metrics need only the same Tables.
func ExampleTables_partition() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()

	orders, err := outbox.NewStore(outbox.Tables{Partition: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	if err := orders.Migrate(ctx, pool); err != nil { // makes the partitioned table
		log.Fatal(err)
	}
	// RunCleanup, in one process or more (they take turns), runs this every minute.
	if _, err := orders.Cleanup(ctx, pool, outbox.CleanupConfig{Retention: 24 * time.Hour}); err != nil {
		log.Fatal(err)
	}
	// relay, err := outbox.NewRelay(pool, pub, outbox.Config{Tables: orders.Tables()})

	st, err := orders.ReadStats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("partitions reach two hours ahead:", time.Until(st.PartitionsEnd) > 2*time.Hour)
	// Output:
	// partitions reach two hours ahead: true
}

// ExampleCommitReplicated answers an idempotent request's replay from what a transaction
// only read: committed with CommitReplicated, the answer is given only once the row it
// comes from is on the synchronous standbys, if the server has any.
func ExampleCommitReplicated() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE answers (key text PRIMARY KEY, body text NOT NULL);
		INSERT INTO answers VALUES ('order-42', '{"id":42}')`); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after a commit it does nothing
	var body string
	if err := tx.QueryRow(ctx, "SELECT body FROM answers WHERE key = $1", "order-42").Scan(&body); err != nil {
		log.Fatal(err)
	}
	if err := outbox.CommitReplicated(ctx, tx); err != nil {
		log.Fatal(err) // the outcome is unknown: answer 503, and let the client retry
	}
	fmt.Println("201", body)
	// Output:
	// 201 {"id":42}
}

// ExampleNewWALRelay publishes the outbox from the transaction log instead of polling the
// table: the database runs at wal_level=logical, the relay connects as a role with
// REPLICATION, and the publication of the outbox table exists (a migration's step). It has
// no Output: the test server runs at wal_level=replica; TestWALRelay runs it on a server of
// its own.
func ExampleNewWALRelay() {
	ctx := context.Background()
	dbURL := os.Getenv("DATABASE_URL") // a role with REPLICATION
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: os.Getenv("AMQP_URL")})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// Once, with the migrations: the table, and the publication the relay reads.
	store, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if err := store.CreatePublication(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}

	// The slot (outbox_messages) is created at the first Run; the rows pending then go out
	// through the relay's retry lane.
	relay, err := outbox.NewWALRelay(pool, pub, outbox.Config{}, outbox.WALConfig{URL: dbURL})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err) // errors.Is(err, outbox.ErrWALSetup): the database needs a change
	}
}

// ExampleStore_ReadSlotStats watches a WAL relay's slot from another process, as
// outboxmetrics.Stats does: a slot nobody streams keeps all the WAL since its position.
// This example's database has no WAL relay, hence no slot.
func ExampleStore_ReadSlotStats() {
	ctx := context.Background()
	pool, _, cleanup := exampleEnv()
	defer cleanup()
	store, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.ReadSlotStats(ctx, pool, "") // the slot of Tables.WALName
	if err != nil {
		log.Fatal(err)
	}
	switch {
	case !st.Exists:
		fmt.Println("no slot: the table is published by a polling relay, or by none")
	case st.Lost:
		fmt.Println("invalidated: the WAL relay creates it again and catches up from the table")
	case !st.Active:
		fmt.Printf("nobody streams it; it keeps %d bytes of WAL\n", st.RetainedBytes)
	default:
		fmt.Printf("streamed, %d bytes not confirmed yet\n", st.LagBytes)
	}
	// Output:
	// no slot: the table is published by a polling relay, or by none
}

// exampleEnv gives an example a fresh database and the broker URL.
func exampleEnv() (pool *pgxpool.Pool, amqpURL string, cleanup func()) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("example_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + name
	pool, err = pgxpool.New(ctx, u.String())
	if err != nil {
		log.Fatal(err)
	}
	amqpURL = os.Getenv("OUTBOXSHOP_TEST_AMQP_URL")
	return pool, amqpURL, func() {
		pool.Close()
		if conn, err := amqp.Dial(amqpURL); err == nil { // what the examples declared
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete("example.orders", false, false, false)
				_, _ = ch.QueueDelete("example.payments", false, false, false) // ExampleStore's
				_ = ch.ExchangeDelete("example.events", false, false)
			}
			_ = conn.Close()
		}
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	}
}

// Migrations holds the schema for goose and golang-migrate. Hand goose the goose folder
// (goose.NewProvider(goose.DialectPostgres, db, files, goose.WithTableName(
// "outbox_goose_db_version"))), golang-migrate the other (iofs.New(outbox.Migrations,
// "migrations/golang-migrate")), or copy the files into your migrations.
func ExampleMigrations() {
	files, err := fs.Sub(outbox.Migrations, "migrations/goose")
	if err != nil {
		log.Fatal(err)
	}
	goose, err := fs.Glob(files, "*.sql")
	if err != nil {
		log.Fatal(err)
	}
	golangMigrate, err := fs.Glob(outbox.Migrations, "migrations/golang-migrate/*.sql")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("goose:", goose)
	fmt.Println("golang-migrate:", golangMigrate)
	// Output:
	// goose: [001_outbox.sql 002_waiting_and_json_payload.sql 003_handed.sql]
	// golang-migrate: [migrations/golang-migrate/001_outbox.down.sql migrations/golang-migrate/001_outbox.up.sql migrations/golang-migrate/002_waiting_and_json_payload.down.sql migrations/golang-migrate/002_waiting_and_json_payload.up.sql migrations/golang-migrate/003_handed.down.sql migrations/golang-migrate/003_handed.up.sql]
}

// Example_tls runs the relays against a database and a broker that take TLS alone, with a
// private CA and a client certificate. A URL says what libpq's do (sslmode=verify-full,
// sslrootcert, sslcert, sslkey); a tls.Config says the rest: the publisher's
// TLSClientConfig, the WAL relay's WALConfig.TLSConfig, or the pool's own
// ConnConfig.TLSConfig. It has no Output: it needs the servers and the files.
func Example_tls() {
	ctx := context.Background()
	// The CA that signs the servers' certificates, and the relay's client certificate.
	roots := x509.NewCertPool()
	ca, err := os.ReadFile("/etc/outbox/tls/ca.crt")
	if err != nil || !roots.AppendCertsFromPEM(ca) {
		log.Fatal("no CA certificate: ", err)
	}
	cert, err := tls.LoadX509KeyPair("/etc/outbox/tls/relay.crt", "/etc/outbox/tls/relay.key")
	if err != nil {
		log.Fatal(err)
	}
	tlsConf := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	// The pool: the URL says it all.
	dbURL := "postgres://relay@db.internal:5432/shop?sslmode=verify-full&sslrootcert=/etc/outbox/tls/ca.crt" +
		"&sslcert=/etc/outbox/tls/relay.crt&sslkey=/etc/outbox/tls/relay.key"
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// The publisher: amqps://, checked against tlsConf's CA for the URL's host.
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: os.Getenv("AMQP_URL"), TLSClientConfig: tlsConf})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	// The WAL relay's replication connection: with a tls.Config, whatever the URL's sslmode.
	relay, err := outbox.NewWALRelay(pool, pub, outbox.Config{}, outbox.WALConfig{
		URL: "postgres://relay@db.internal:5432/shop", TLSConfig: tlsConf,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}

package outboxtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
)

// placeOrder is the code under test: it writes an order and its event in the caller's
// transaction.
func placeOrder(ctx context.Context, tx pgx.Tx, orderID string, totalCents int) error {
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, status) VALUES ($1, 'PENDING')", orderID); err != nil {
		return err
	}
	payload, err := json.Marshal(map[string]any{"order_id": orderID, "total_cents": totalCents})
	if err != nil {
		return err
	}
	return outbox.Add(ctx, tx, outbox.Message{
		Exchange:      "shop.events",
		RoutingKey:    "order.created",
		Type:          "OrderCreated",
		AggregateType: "order",
		AggregateID:   orderID,
		Payload:       payload,
		Headers:       map[string]string{outbox.HeaderCorrelationID: "req-42"},
	})
}

// A test of code that writes to the outbox asserts what its transaction added, before
// anything commits. In a real test t is the test's *testing.T; here a stand-in prints
// failures.
func ExampleRequireAdded() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // the test's writes never commit
	if err := placeOrder(ctx, tx, "order-1", 1250); err != nil {
		log.Fatal(err)
	}

	m := outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
		Type:        "OrderCreated",
		RoutingKey:  "order.created",
		AggregateID: "order-1",
		Payload:     map[string]any{"order_id": "order-1", "total_cents": 1250},
		Headers:     map[string]string{outbox.HeaderCorrelationID: "req-42"},
	}, nil)
	outboxtest.RequireNotAdded(ctx, t, tx, outboxtest.Expect{Type: "OrderCancelled"}, nil)
	fmt.Println("added", m.Type, "for", m.AggregateID)
	// Output:
	// added OrderCreated for order-1
}

// A failed assertion names what the transaction added and how each message differs from
// the expectation.
func ExampleRequireAdded_failure() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := placeOrder(ctx, tx, "order-1", 1250); err != nil {
		log.Fatal(err)
	}

	outboxtest.RequireAdded(ctx, t, tx, outboxtest.Expect{
		Type:    "OrderCreated",
		Payload: json.RawMessage(`{"order_id": "order-1", "total_cents": 999}`),
	}, nil)
	// Output:
	// outboxtest: no message added by the transaction matches
	//   want: type="OrderCreated" payload={"order_id":"order-1","total_cents":999}
	//   the transaction added 1:
	//   [0] type="OrderCreated" exchange="shop.events" routing_key="order.created" aggregate=order/order-1 payload={"order_id":"order-1","total_cents":1250} headers={"correlation_id":"req-42"}
	//       differs: payload: want {"order_id":"order-1","total_cents":999}, got {"order_id":"order-1","total_cents":1250}
	// FailNow
}

// A relay can run against a Publisher instead of a broker: it confirms what it is given,
// unless the test scripted another outcome, and records it.
func ExamplePublisher() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := placeOrder(ctx, tx, "order-1", 1250); err != nil {
			return err
		}
		return placeOrder(ctx, tx, "order-2", 700)
	})
	if err != nil {
		log.Fatal(err)
	}

	pub := &outboxtest.Publisher{}
	pub.Script(outbox.ErrUnavailable) // the first message finds the broker down; no attempt counts
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{OutageBaseDelay: time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(runCtx) }()

	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	published, err := pub.WaitPublished(waitCtx, 2)
	if err != nil {
		log.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Messages of different aggregates have no order between them.
	slices.SortFunc(published, func(a, b outbox.Message) int { return strings.Compare(a.AggregateID, b.AggregateID) })
	for _, m := range published {
		fmt.Println("published", m.Type, "for", m.AggregateID)
	}
	fmt.Println("attempts:", len(pub.Attempts()))
	// Output:
	// published OrderCreated for order-1
	// published OrderCreated for order-2
	// attempts: 3
}

// printingT stands in for a test's *testing.T in the examples: it prints what a test would
// report.
type printingT struct{}

func (printingT) Helper()                           {}
func (printingT) Errorf(format string, args ...any) { fmt.Printf(format+"\n", args...) }
func (printingT) FailNow()                          { fmt.Println("FailNow") }

// exampleDB gives an example a fresh database with the outbox and an orders table.
func exampleDB() (pool *pgxpool.Pool, cleanup func()) {
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
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	}
}

package inboxrabbitmqtest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqtest"
)

// reserveStock is the handler under test: it reserves one unit of the SKU in the message's
// type, and refuses an unknown SKU for good.
func reserveStock(ctx context.Context, tx pgx.Tx, sku string) error {
	tag, err := tx.Exec(ctx, "UPDATE stock SET reserved = reserved + 1 WHERE sku = $1", sku)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return inbox.Permanent(fmt.Errorf("unknown SKU %q", sku))
	}
	return nil
}

// Deliver runs a inboxrabbitmq.Handler as the RabbitMQ consumer built from the same
// Config would, and reports what the consumer does next: acknowledge, hold and retry in
// place, retry as a counted attempt, or dead-letter.
func ExampleDeliver() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	cfg := inboxrabbitmq.Config{
		Name:          "stock",
		MaxDeliveries: 3,
		Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if d.Type == "pricing.needed" {
				return errors.New("price not known yet") // neither permanent nor transient: counts
			}
			return reserveStock(ctx, tx, string(d.Body))
		},
	}
	d := inboxrabbitmq.Delivery{ID: "order-44", Type: "order.placed", ContentType: "text/plain", Body: []byte("sku-1")}
	inboxrabbitmqtest.RequireHandledOnce(ctx, t, pool, cfg, d, nil)

	for _, d := range []inboxrabbitmq.Delivery{
		{ID: "order-45", Type: "order.placed", ContentType: "text/plain", Body: []byte("sku-404")},
		{ID: "order-46", Type: "pricing.needed", ContentType: "text/plain", DeliveryCount: 1},
		{ID: "order-47", Type: "pricing.needed", ContentType: "text/plain", DeliveryCount: 3},
	} {
		h := inboxrabbitmqtest.Deliver(ctx, pool, cfg, d, nil)
		if h.Reason != "" {
			fmt.Printf("%s: %s (%s)\n", d.ID, h.Outcome, h.Reason)
		} else {
			fmt.Printf("%s: %s\n", d.ID, h.Outcome)
		}
	}
	// Output:
	// order-45: dead-lettered (permanent-error)
	// order-46: retried
	// order-47: dead-lettered (max-deliveries)
}

// printingT stands in for a test's *testing.T in the examples: it prints what a test would
// report.
type printingT struct{}

func (printingT) Helper()                           {}
func (printingT) Errorf(format string, args ...any) { fmt.Printf(format+"\n", args...) }
func (printingT) FailNow()                          { fmt.Println("FailNow") }

// exampleDB gives an example a fresh database with the inbox and a stock table.
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
	if err := inbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL); INSERT INTO stock VALUES ('sku-1', 0)"); err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	}
}

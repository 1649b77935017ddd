package inboxtest_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxtest"
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

// A test delivers a message to its handler through the inbox, twice: the first delivery
// runs the handler and commits, the second is a duplicate that does not call it. In a real
// test t is the test's *testing.T; here a stand-in prints failures.
func ExampleRequireProcessedOnce() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	msg := inbox.Message{ID: "order-42", Type: "order.placed"}
	handler := func(ctx context.Context, tx pgx.Tx) error { return reserveStock(ctx, tx, "sku-1") }
	inboxtest.RequireProcessedOnce(ctx, t, pool, "stock", msg, handler, nil)

	var reserved int
	if err := pool.QueryRow(ctx, "SELECT reserved FROM stock WHERE sku = 'sku-1'").Scan(&reserved); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved:", reserved)
	// Output:
	// reserved: 1
}

// Deliver reports the class of a handler's error, which decides what a consumer does with
// the message: here a permanent one, which a consumer dead-letters at once.
func ExampleDeliver() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	msg := inbox.Message{ID: "order-43", Type: "order.placed"}
	res := inboxtest.Deliver(ctx, pool, "stock", msg, func(ctx context.Context, tx pgx.Tx) error {
		return reserveStock(ctx, tx, "sku-404")
	}, nil)
	err := res.RequireError(t, inbox.ClassPermanent)
	fmt.Println("class:", res.Class)
	fmt.Println("error:", err)
	// Output:
	// class: permanent
	// error: handle message "order-43": unknown SKU "sku-404"
}

// Options.BeforeCommit looks into the handler's transaction before it commits.
func ExampleOptions() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	t := printingT{}

	opts := &inboxtest.Options{BeforeCommit: func(ctx context.Context, tx pgx.Tx) {
		var reserved int
		if err := tx.QueryRow(ctx, "SELECT reserved FROM stock WHERE sku = 'sku-1'").Scan(&reserved); err != nil {
			log.Fatal(err)
		}
		fmt.Println("reserved inside the transaction:", reserved)
	}}
	msg := inbox.Message{ID: "order-48", Type: "order.placed"}
	inboxtest.Deliver(ctx, pool, "stock", msg, func(ctx context.Context, tx pgx.Tx) error {
		return reserveStock(ctx, tx, "sku-1")
	}, opts).RequireProcessed(t)
	// Output:
	// reserved inside the transaction: 1
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

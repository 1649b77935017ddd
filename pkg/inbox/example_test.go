package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// A message delivered twice changes the stock once.
func ExampleProcess() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx) // a throwaway database for this example
	defer drop()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL);
		INSERT INTO stock VALUES ('sku-1', 0)`); err != nil {
		panic(err)
	}

	reserve := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, "sku-1")
		return err
	}
	msg := inbox.Message{ID: "order-42", Type: "order.placed"}
	for range 2 { // the broker delivers the message twice
		duplicate, err := inbox.Process(ctx, pool, "stock", msg, reserve)
		if err != nil {
			panic(err) // do not acknowledge: the broker redelivers it
		}
		fmt.Println("duplicate:", duplicate) // acknowledge the delivery in both cases
	}

	var reserved int
	if err := pool.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'sku-1'`).Scan(&reserved); err != nil {
		panic(err)
	}
	fmt.Println("reserved:", reserved)
	// Output:
	// duplicate: false
	// duplicate: true
	// reserved: 1
}

// An inbox of your own naming: the ledger keeps its inbox in schema billing, as
// ledger_inbox, beside other inboxes in the same database. Migrate creates the schema; a
// message is deduplicated per table. The RabbitMQ consumer takes the same Tables in its
// Config.
func ExampleStore() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()

	ledger, err := inbox.NewStore(inbox.Tables{Schema: "billing", Messages: "ledger_inbox"})
	if err != nil {
		panic(err) // wraps inbox.ErrInvalidTables
	}
	if err := ledger.Migrate(ctx, pool); err != nil { // once, at start-up
		panic(err)
	}
	msg := inbox.Message{ID: "payment-7", Type: "payment.captured"}
	for range 2 { // the broker delivers the message twice
		duplicate, err := ledger.Process(ctx, pool, "ledger", msg, nil)
		if err != nil {
			panic(err)
		}
		fmt.Println(ledger.Tables(), "duplicate:", duplicate)
	}
	// Output:
	// "billing"."ledger_inbox" duplicate: false
	// "billing"."ledger_inbox" duplicate: true
}

// Tables.Partition keeps the inbox in a table partitioned by processing time: Migrate makes
// it and the next partitions, Cleanup (RunCleanup in a service) makes more ahead and drops
// whole the ones whose retention is over. Copies of a message are duplicates across
// partitions, as in a plain table.
func ExampleTables_partition() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()

	stock, err := inbox.NewStore(inbox.Tables{Partition: 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	if err := stock.Migrate(ctx, pool); err != nil { // makes the partitioned table
		panic(err)
	}
	// RunCleanup, in one process or more (they take turns), runs this every ten minutes.
	if _, err := stock.Cleanup(ctx, pool, inbox.CleanupConfig{Retention: 7 * 24 * time.Hour}); err != nil {
		panic(err)
	}
	// consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{Tables: stock.Tables(), ...})

	msg := inbox.Message{ID: "order-7", Type: "order.placed"}
	for range 2 { // the broker delivers the message twice
		duplicate, err := stock.Process(ctx, pool, "stock", msg, nil)
		if err != nil {
			panic(err)
		}
		fmt.Println("duplicate:", duplicate)
	}
	end, err := stock.PartitionsEnd(ctx, pool)
	if err != nil {
		panic(err)
	}
	fmt.Println("partitions reach two days ahead:", time.Until(end) > 48*time.Hour)
	// Output:
	// duplicate: false
	// duplicate: true
	// partitions reach two days ahead: true
}

// Migrate is safe to call on every start, from every replica.
func ExampleMigrate() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()

	for range 2 {
		if err := inbox.Migrate(ctx, pool); err != nil {
			panic(err)
		}
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('inbox_messages') IS NOT NULL`).Scan(&exists); err != nil {
		panic(err)
	}
	fmt.Println("inbox_messages exists:", exists)
	// Output: inbox_messages exists: true
}

// Cleanup forgets messages processed longer ago than the retention. In a service, run
// RunCleanup in a goroutine instead.
func ExampleCleanup() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	for _, id := range []string{"order-1", "order-2"} {
		if _, err := inbox.Process(ctx, pool, "stock", inbox.Message{ID: id}, nil); err != nil {
			panic(err)
		}
	}
	// Pretend order-1 was processed a month ago.
	if _, err := pool.Exec(ctx, `UPDATE inbox_messages SET processed_at = now() - interval '30 days' WHERE message_id = 'order-1'`); err != nil {
		panic(err)
	}

	deleted, err := inbox.Cleanup(ctx, pool, inbox.CleanupConfig{
		Retention: 14 * 24 * time.Hour, // far longer than any redelivery can take
		BatchSize: 500,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("deleted:", deleted)
	// Output: deleted: 1
}

// CommitReplicated is how Process commits, for the transactions of your own whose outcome
// you acknowledge: here an API's answer read back from a row. It returns once the row is on
// the synchronous standbys, if the server has any.
func ExampleCommitReplicated() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);
		INSERT INTO stock VALUES ('BOOK-1', 7)`); err != nil {
		panic(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after a commit it does nothing
	var onHand int
	if err := tx.QueryRow(ctx, "SELECT on_hand FROM stock WHERE sku = $1", "BOOK-1").Scan(&onHand); err != nil {
		panic(err)
	}
	if err := inbox.CommitReplicated(ctx, tx); err != nil {
		panic(err) // the outcome is unknown: answer 503, and let the client retry
	}
	fmt.Println("on hand:", onHand)
	// Output: on hand: 7
}

// A handler marks errors that no retry can fix as permanent; consumers dead-letter those at
// once.
func ExamplePermanent() {
	err := fmt.Errorf("reserve stock: %w", inbox.Permanent(errors.New("unknown sku")))
	fmt.Println(inbox.IsPermanent(err), err)
	fmt.Println(inbox.IsPermanent(errors.New("connection reset")))
	// Output:
	// true reserve stock: unknown sku
	// false
}

// exampleDatabase creates an empty database on the server named by
// OUTBOXSHOP_TEST_POSTGRES_URL and returns a pool on it and a function that drops it. Examples need it only to run side by side with the tests.
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

// A handler marks what it knows: a dependency that is down is transient (the runner holds the
// message and retries it in place, without counting an attempt), a payload that breaks the
// contract is permanent (dead-lettered at once). PostgreSQL's errors are classified by their
// SQLSTATE without a mark.
func ExampleClassify() {
	errPricing := errors.New("pricing service: 503 Service Unavailable")
	for _, err := range []error{
		fmt.Errorf("price order: %w", inbox.Transient(errPricing)),
		inbox.Permanent(errors.New("order.placed version 3 is not supported")),
		&pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"},
		&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"},
		&pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key value violates unique constraint"},
		errors.New("warehouse says no"),
	} {
		fmt.Printf("%-9s %v\n", inbox.Classify(err), err)
	}
	// Output:
	// transient price order: pricing service: 503 Service Unavailable
	// permanent order.placed version 3 is not supported
	// transient ERROR: deadlock detected (SQLSTATE 40P01)
	// transient FATAL: terminating connection due to administrator command (SQLSTATE 57P01)
	// failed    ERROR: duplicate key value violates unique constraint (SQLSTATE 23505)
	// failed    warehouse says no
}

// Migrations holds the schema for goose and golang-migrate. Hand goose the goose folder
// (goose.NewProvider(goose.DialectPostgres, db, files, goose.WithTableName(
// "inbox_goose_db_version"))), golang-migrate the other (iofs.New(inbox.Migrations,
// "migrations/golang-migrate")), or copy the files into your migrations.
func ExampleMigrations() {
	files, err := fs.Sub(inbox.Migrations, "migrations/goose")
	if err != nil {
		panic(err)
	}
	goose, err := fs.Glob(files, "*.sql")
	if err != nil {
		panic(err)
	}
	golangMigrate, err := fs.Glob(inbox.Migrations, "migrations/golang-migrate/*.sql")
	if err != nil {
		panic(err)
	}
	fmt.Println("goose:", goose)
	fmt.Println("golang-migrate:", golangMigrate)
	// Output:
	// goose: [001_inbox.sql]
	// golang-migrate: [migrations/golang-migrate/001_inbox.down.sql migrations/golang-migrate/001_inbox.up.sql]
}

// A batch of deliveries in one transaction, each message under its own savepoint: one that
// fails is rolled back alone, and one delivered twice is processed once. Acknowledge the
// messages whose Err is nil; the broker redelivers the others.
func ExampleProcessBatch() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
	defer drop()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL);
		INSERT INTO stock VALUES ('sku-1', 0)`); err != nil {
		panic(err)
	}

	msgs := []inbox.Message{
		{ID: "order-41", Type: "order.placed"},
		{ID: "order-42", Type: "order.placed"},
		{ID: "order-41", Type: "order.placed"}, // delivered twice
		{ID: "order-43", Type: "order.placed"},
	}
	results, err := inbox.ProcessBatch(ctx, pool, "stock", msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
		if _, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, "sku-1"); err != nil {
			return err
		}
		if msgs[i].ID == "order-42" {
			return errors.New("payment declined") // its reservation is rolled back
		}
		return nil
	})
	if err != nil {
		panic(err) // acknowledge none: the broker redelivers them all
	}
	for i, r := range results {
		switch {
		case r.Err != nil:
			fmt.Println(msgs[i].ID, "failed:", r.Err) // do not acknowledge
		case r.Duplicate:
			fmt.Println(msgs[i].ID, "duplicate")
		default:
			fmt.Println(msgs[i].ID, "processed")
		}
	}

	var reserved int
	if err := pool.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'sku-1'`).Scan(&reserved); err != nil {
		panic(err)
	}
	fmt.Println("reserved:", reserved)
	// Output:
	// order-41 processed
	// order-42 failed: handle message "order-42": payment declined
	// order-41 duplicate
	// order-43 processed
	// reserved: 2
}

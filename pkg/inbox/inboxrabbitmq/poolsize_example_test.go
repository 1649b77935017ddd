package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// The consumer handles up to Concurrency messages at once (default: Prefetch, 32), each in a
// transaction of its own. pgxpool's default pool of max(4, CPUs) connections makes the
// handlers wait for connections; NewConsumer logs a warning.
func ExampleConsumer_PoolSize() {
	cfg, err := pgxpool.ParseConfig("postgres://localhost/shop?pool_max_conns=4")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects on first use
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	consumer, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                "amqp://guest:guest@localhost:5672/",
		Queue:              "shop.orders",
		Name:               "shop-orders",
		DeadLetterExchange: "shop.dead",
		Handler:            func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	size := consumer.PoolSize()
	fmt.Printf("needs %d connections, the pool has %d: short by %d\n", size.Needed, size.Max, size.Shortfall())
	// Output: needs 32 connections, the pool has 4: short by 28
}

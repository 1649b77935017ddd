package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// A relay holds three connections of its pool at most by default: one for each of its two
// batches in flight and one for its maintenance (the one it keeps for LISTEN is taken out of
// the pool). A pool of one works, more slowly; NewRelay logs a warning.
func ExampleRelay_PoolSize() {
	cfg, err := pgxpool.ParseConfig("postgres://localhost/shop?pool_max_conns=1")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects on first use
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: "amqp://guest:guest@localhost:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	size := relay.PoolSize()
	fmt.Printf("needs %d connections, the pool has %d: short by %d\n", size.Needed, size.Max, size.Shortfall())
	// Output: needs 3 connections, the pool has 1: short by 2
}

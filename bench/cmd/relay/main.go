// Command relay is the smallest relay process: one pkg/outbox Relay with the RabbitMQ
// publisher, as a service's `relay` subcommand runs it, and nothing else. The bench starts
// it as a separate process to read its peak RSS while it drains a backlog (item 8), so it
// links no more than a relay needs.
//
//	relay -database-url URL -amqp-url URL [-batch N] [-rows N] [-wal-url URL] [-first]
//
// With -rows it prints "drained <rows> <seconds>" once the BatchDone hook counted that many
// rows published, and keeps running until SIGINT or SIGTERM. With -wal-url it runs a
// pkg/outbox WALRelay instead, reading its slot through that URL (item 10 kills it
// mid-drain). With -first it prints "published <seconds>" once its first batch is published.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	dbURL := fs.String("database-url", "", "the database of the outbox")
	amqpURL := fs.String("amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "the broker")
	batch := fs.Int("batch", 0, "rows per relay cycle (0: pkg/outbox's default)")
	rows := fs.Int64("rows", 0, `print "drained" once this many rows were published`)
	walURL := fs.String("wal-url", "", "run the WAL relay, reading its slot through this URL")
	first := fs.Bool("first", false, `print "published" once the first batch is published`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = max(pcfg.MaxConns, 2*outbox.DefaultInFlightBatches+2) // the WAL relay's, above a polling relay's
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: *amqpURL, ConnectionName: "bench-relay-process", Connections: outbox.DefaultInFlightBatches})
	if err != nil {
		return err
	}
	defer pub.Close()
	var published atomic.Int64
	start := time.Now()
	cfg := outbox.Config{
		BatchSize: *batch,
		Hooks: outbox.Hooks{BatchDone: func(b outbox.BatchResult) {
			n := published.Add(int64(len(b.Published)))
			before := n - int64(len(b.Published))
			if *first && before == 0 && n > 0 {
				fmt.Fprintf(stdout, "published %.3f\n", time.Since(start).Seconds())
			}
			if *rows > 0 && before < *rows && n >= *rows {
				fmt.Fprintf(stdout, "drained %d %.3f\n", n, time.Since(start).Seconds())
			}
		}},
	}
	if *walURL != "" {
		relay, err := outbox.NewWALRelay(pool, pub, cfg, outbox.WALConfig{URL: *walURL})
		if err != nil {
			return err
		}
		return relay.Run(ctx)
	}
	relay, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

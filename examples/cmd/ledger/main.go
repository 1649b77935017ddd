// Command ledger runs the consumer: it declares the topology, consumes the ledger's queue
// through the inbox, and logs each message it processed, duplicates included. Ctrl-C stops
// it gracefully.
//
// Environment: DATABASE_URL (default the local PostgreSQL's postgres database) and AMQP_URL
// (default the local RabbitMQ as guest).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"

	"example.com/billing/events"
	"example.com/billing/ledger"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := config{
		DatabaseURL: cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		AMQPURL:     cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"),
	}
	if err := run(ctx, cfg, logger); err != nil {
		logger.Error("ledger stopped", "err", err)
		os.Exit(1)
	}
}

type config struct {
	DatabaseURL, AMQPURL string
}

func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	topo := events.DefaultTopology()
	svc, err := ledger.New(pool, topo, logger)
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	consumer, err := svc.Consumer(inboxrabbitmq.Config{
		URL: cfg.AMQPURL,
		// Each message in flight holds a pool connection: as many as the pool has, but one
		// for the cleanup (pool_max_conns in DATABASE_URL sizes the pool).
		Concurrency: min(inboxrabbitmq.DefaultPrefetch, int(pool.Config().MaxConns)-1),
		Hooks: inboxrabbitmq.Hooks{Processed: func(p inboxrabbitmq.ProcessedMessage) {
			logger.Info("message processed", "type", p.Type, "duplicate", p.Duplicate)
		}},
	})
	if err != nil {
		return err
	}

	// Two loops; the first to fail stops the other, and each returns nil when ctx ends.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- consumer.Run(ctx) }()
	go func() { errc <- svc.RunCleanup(ctx) }()
	logger.Info("ledger consuming", "queue", topo.Queue)
	var errs []error
	for range 2 {
		if err := <-errc; err != nil {
			errs = append(errs, err)
			cancel()
		}
	}
	return errors.Join(errs...)
}

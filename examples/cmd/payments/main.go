// Command payments runs the producer: POST /payments on ADDR (default :8081), and the relay
// that publishes the outbox to RabbitMQ, in one process. Ctrl-C stops it gracefully.
//
// Environment: DATABASE_URL (default the local PostgreSQL's postgres database), AMQP_URL
// (default the local RabbitMQ as guest), ADDR.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"

	"example.com/billing/events"
	"example.com/billing/payments"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := config{
		DatabaseURL: cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		AMQPURL:     cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"),
		Addr:        cmp.Or(os.Getenv("ADDR"), ":8081"),
	}
	if err := run(ctx, cfg, logger); err != nil {
		logger.Error("payments stopped", "err", err)
		os.Exit(1)
	}
}

type config struct {
	DatabaseURL, AMQPURL, Addr string
}

func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	topo := events.DefaultTopology()
	svc, err := payments.New(pool, topo, logger)
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}

	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: cfg.AMQPURL, Setup: topo.DeclareExchange, Logger: logger})
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	relay, err := svc.Relay(pub, outbox.Config{Logger: logger})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr:              cfg.Addr,
		Handler:           svc,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
	}

	// Three loops; the first to fail stops the others, and each returns nil when ctx ends.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- relay.Run(ctx) }()
	go func() { errc <- svc.RunCleanup(ctx) }()
	go func() { errc <- serve(ctx, srv) }()
	logger.Info("payments listening", "addr", cfg.Addr, "exchange", topo.Exchange)
	var errs []error
	for range 3 {
		if err := <-errc; err != nil {
			errs = append(errs, err)
			cancel()
		}
	}
	return errors.Join(errs...)
}

// serve runs srv until ctx ends, then shuts it down, letting requests under way finish.
func serve(ctx context.Context, srv *http.Server) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}

// Command alertlog is the Alertmanager webhook receiver of the compose stack (service
// alert-logger): it logs every alert it is sent as a JSON line. It listens on
// ALERTLOG_HTTP_ADDR (default :8080); SIGINT and SIGTERM stop it. See package
// github.com/outboxshop/outboxshop/tools/alertlog.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/outboxshop/outboxshop/tools/alertlog"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "alertlog:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := env.ParseAs[alertlog.Config]()
	if err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil)).With("service", "alert-logger")
	return alertlog.Run(ctx, cfg, log)
}

// Package httpserver serves HTTP with timeouts and a graceful shutdown.
package httpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Config sets the server's timeouts. Zero values take the defaults.
type Config struct {
	ReadHeaderTimeout time.Duration // default 5s
	ReadTimeout       time.Duration // default 10s
	WriteTimeout      time.Duration // default 15s
	IdleTimeout       time.Duration // default 60s
	ShutdownTimeout   time.Duration // default 10s: in-flight requests get this long to finish
}

// Serve serves h on ln until ctx is cancelled, then stops accepting, lets in-flight requests
// finish (up to ShutdownTimeout) and returns nil. It returns the error that stopped it
// otherwise.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, cfg Config, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(cfg.ReadHeaderTimeout, 5*time.Second),
		ReadTimeout:       cmp.Or(cfg.ReadTimeout, 10*time.Second),
		WriteTimeout:      cmp.Or(cfg.WriteTimeout, 15*time.Second),
		IdleTimeout:       cmp.Or(cfg.IdleTimeout, 60*time.Second),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("http server listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), cmp.Or(cfg.ShutdownTimeout, 10*time.Second))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("http server shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}

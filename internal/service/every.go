package service

import (
	"context"
	"time"
)

// Every calls f at once and then every interval, until ctx ends; it returns nil then. f gets
// ctx, and a call that is still running when ctx ends finishes first. A tick missed while f
// runs is dropped, not queued. It is the loop of the periodic jobs (the cleanup of idempotency
// keys, the stock gauge), whose f logs its own failures.
func Every(ctx context.Context, interval time.Duration, f func(ctx context.Context)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// The backoff of a periodic job whose run failed ([Job].Backoff's default): the libraries'
// outage backoff (pkg/outbox DefaultOutageBaseDelay and DefaultOutageMaxDelay, which the
// cleanups and stats loops of both libraries use too), so that every loop of a process
// backs off alike while the database is away.
const (
	DefaultOutageBaseDelay = outbox.DefaultOutageBaseDelay
	DefaultOutageMaxDelay  = outbox.DefaultOutageMaxDelay
)

// Job is a periodic job of a process (the cleanup of idempotency keys, the stock gauge):
// what [Every] runs.
type Job struct {
	// Name names the job in its log lines ("idempotency key cleanup"): the What of its
	// failure streak (internal/retry). Required.
	Name string
	// Interval is the time between the starts of two runs while they succeed, and the
	// longest wait after a failed one. Required.
	Interval time.Duration
	// Run does the job once and returns its failure; it logs what it did, not that it
	// failed: Every does that. Required.
	Run func(ctx context.Context) error
	// Logger gets the job's failure streaks. nil discards.
	Logger *slog.Logger
	// Backoff spaces the runs after a failure, never further apart than Interval. Default
	// DefaultOutageBaseDelay doubling to DefaultOutageMaxDelay, jittered.
	Backoff retry.Backoff
	// LogInterval is the least time between two lines of one failure streak. Default
	// retry.DefaultLogInterval (30s).
	LogInterval time.Duration
}

// Every runs job.Run at once and then every job.Interval, until ctx ends; it returns nil
// then, or an error at once when job lacks a required field. A run still going when ctx ends
// finishes first (Run gets ctx).
//
// A failed run is retried after job.Backoff, but never later than job.Interval: min(backoff,
// interval) after the failure, so that a job whose database came back runs again soon,
// without retrying faster than the backoff allows while it is away. The failures are logged
// through one retry.Streak named job.Name: a Warn line when they start (with the error), at
// most one per job.LogInterval while they go on (with how many runs failed), and an Info line
// when a run succeeds again (with how long the job was down). After a successful run the
// next starts job.Interval after its start (at once when the run took longer).
func Every(ctx context.Context, job Job) error {
	switch {
	case job.Name == "":
		return errors.New("periodic job: a name is required")
	case job.Interval <= 0:
		return fmt.Errorf("periodic job %q: the interval must be positive, is %s", job.Name, job.Interval)
	case job.Run == nil:
		return fmt.Errorf("periodic job %q: Run is required", job.Name)
	}
	backoff := job.Backoff
	if backoff.Base <= 0 {
		backoff = retry.Backoff{Base: DefaultOutageBaseDelay, Max: DefaultOutageMaxDelay}
	}
	failures := &retry.Streak{What: job.Name, Logger: job.Logger, Backoff: backoff, LogInterval: job.LogInterval}
	for {
		start := time.Now()
		err := job.Run(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil: // the backoff from now, capped by the interval
			wait = min(failures.Fail(ctx, err), job.Interval)
		default: // the interval from the run's start
			failures.Succeed(ctx)
			wait = job.Interval - time.Since(start)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

package service_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// runEvery runs service.Every(ctx, job) in the background; the returned function cancels it
// and returns its result.
func runEvery(t *testing.T, job service.Job) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Every(ctx, job) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Every did not return after ctx ended")
			}
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestEvery(t *testing.T) {
	t.Parallel()

	t.Run("CallsAtOnceThenEveryInterval", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		third := make(chan struct{})
		stop := runEvery(t, service.Job{Name: "job", Interval: time.Millisecond, Run: func(context.Context) error {
			if calls.Add(1) == 3 {
				close(third)
			}
			return nil
		}})
		select {
		case <-third:
		case <-time.After(10 * time.Second):
			t.Fatal("no third call")
		}
		require.NoError(t, stop())
	})

	t.Run("FirstCallIsImmediate", func(t *testing.T) {
		t.Parallel()
		called := make(chan struct{}, 1)
		stop := runEvery(t, service.Job{Name: "job", Interval: time.Hour, Run: func(context.Context) error {
			called <- struct{}{}
			return nil
		}})
		select {
		case <-called:
		case <-time.After(10 * time.Second):
			t.Fatal("the first call waited for the interval")
		}
		require.NoError(t, stop())
	})

	t.Run("RetriesAFailedRunBeforeTheInterval", func(t *testing.T) {
		t.Parallel()
		logger, logs := testinfra.NewLogs(t)
		var calls atomic.Int32
		second := make(chan struct{})
		stop := runEvery(t, service.Job{Name: "job", Interval: time.Hour, Logger: logger, Run: func(context.Context) error {
			if calls.Add(1) == 1 {
				return errors.New("database away")
			}
			close(second)
			return nil
		}})
		select {
		case <-second: // after the base delay, not the hour
		case <-time.After(10 * time.Second):
			t.Fatal("a failed run was not retried before the interval")
		}
		// The recovery is logged after the second run returned: a stop before that would
		// end the loop first.
		testinfra.Eventually(t, 10*time.Second, func() bool { return logs.Count(slog.LevelInfo, "job: recovered") == 1 },
			"no recovery line: %s", logs.String(slog.LevelDebug))
		require.NoError(t, stop())
		require.Equal(t, 1, logs.Count(slog.LevelWarn, "job: failing"), logs.String(slog.LevelDebug))
		require.Contains(t, logs.String(slog.LevelWarn), "database away", "the first line has the cause")
		require.Equal(t, 1, logs.Count(slog.LevelInfo, "job: recovered"), logs.String(slog.LevelDebug))
	})

	t.Run("RejectsAnIncompleteJob", func(t *testing.T) {
		t.Parallel()
		run := func(context.Context) error { return nil }
		for name, job := range map[string]service.Job{
			"no name":     {Interval: time.Second, Run: run},
			"no interval": {Name: "job", Run: run},
			"no Run":      {Name: "job", Interval: time.Second},
		} {
			require.Error(t, service.Every(context.Background(), job), name)
		}
	})

	// An outage of cut: the job fails from its third run on until cut has passed since the
	// first failure. The runs during the outage are held to what the backoff allows, and the
	// log to one line when it starts, one per LogInterval, one when it ends. A loop that
	// retried without a delay would run thousands of times.
	t.Run("BacksOffAndLogsAnOutageOnce", func(t *testing.T) {
		t.Parallel()
		const (
			interval    = time.Second
			logInterval = time.Second
			cut         = 3 * time.Second
		)
		backoff := retry.Backoff{Base: 100 * time.Millisecond, Max: 10 * time.Second}
		logger, logs := testinfra.NewLogs(t)
		var calls, failed atomic.Int64
		var down atomic.Bool
		firstFailure := make(chan struct{})
		stop := runEvery(t, service.Job{
			Name: "test job", Interval: interval, Backoff: backoff, LogInterval: logInterval, Logger: logger,
			Run: func(context.Context) error {
				if calls.Add(1) == 3 { // healthy twice, then the outage starts
					down.Store(true)
					close(firstFailure)
				}
				if down.Load() {
					failed.Add(1)
					return errors.New("connection refused")
				}
				return nil
			},
		})
		select {
		case <-firstFailure:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not run three times")
		}
		<-time.After(cut) // the outage's length, not a synchronisation
		down.Store(false)
		attempts := failed.Load()
		testinfra.Eventually(t, 10*time.Second, func() bool { return logs.Count(slog.LevelInfo, "test job: recovered") == 1 },
			"the job recovers once the outage ended")
		require.NoError(t, stop())

		// The wait after a failure is min(backoff, interval): the backoff capped at the
		// interval bounds it. +1: the run at the end of the outage.
		bound := retry.Backoff{Base: backoff.Base, Max: min(backoff.Max, interval)}.MaxAttempts(cut) + 1
		t.Logf("%d runs during a %s outage (at most %d), %d Warn lines", attempts, cut, bound, logs.Count(slog.LevelWarn, ""))
		require.LessOrEqual(t, attempts, int64(bound), "runs during a %s outage", cut)
		require.GreaterOrEqual(t, attempts, int64(3), "the failed run is retried before the interval")
		warns := logs.Count(slog.LevelWarn, "")
		require.GreaterOrEqual(t, warns, 1, "the outage is logged")
		require.LessOrEqual(t, warns, 1+int(cut/logInterval), "Warn lines of a %s outage:\n%s", cut, logs.String(slog.LevelDebug))
		require.Contains(t, logs.String(slog.LevelWarn), "connection refused")
		for _, r := range logs.Records() {
			require.True(t, strings.HasPrefix(r.Msg, "test job: "), "every line names the job: %q", r.Msg)
		}
	})
}

package inboxrabbitmq_test

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestOutageBackoff takes the broker or the database away from each of the consumer's loops
// for a few seconds, through a proxy, and counts what the loop did meanwhile: its attempts,
// against the most its backoff allows (retry.Backoff.MaxAttempts), and its lines at warning
// level, against one when the outage starts plus one per log interval. A loop that retried
// at once would make thousands of attempts in the cut, against the few dozen allowed; one
// that logged every attempt would write as many warnings.
func TestOutageBackoff(t *testing.T) {
	t.Parallel()
	const cutFor = 3 * time.Second

	// The reconnect loop: the broker goes away under a consuming consumer.
	for _, tc := range []struct {
		name        string
		logInterval time.Duration // 0: the default, longer than the cut
	}{
		{name: "ReconnectLoop"},
		{name: "ReconnectLoopLogsOncePerInterval", logInterval: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			proxy := testinfra.NewProxy(t, hostPort(t, b.amqpURL))
			logger, logs := testinfra.NewLogs(t)
			cfg := b.config(recordEffect)
			// Each ack at once, before the Processed hook: waitProcessed then means acknowledged,
			// and no ack is still waiting to go out when the broker is cut.
			cfg.AckEvery = 1
			cfg.URL = proxy.RewriteURL(t, b.amqpURL)
			cfg.Logger = logger
			c, err := inboxrabbitmq.NewConsumer(b.pool, cfg)
			require.NoError(t, err)
			if tc.logInterval > 0 {
				c.SetLogInterval(tc.logInterval)
			}
			b.runConsumer(t, c)
			b.events.waitConnected(t, true)
			b.publish(t, jsonMessage("before"))
			waitProcessed(t, b, 1) // and acknowledged: a lost ack would log a warning of its own

			dials := proxy.Dials()
			cutAt := time.Now()
			proxy.Cut()
			b.events.waitConnected(t, false)
			testinfra.Eventually(t, 30*time.Second, func() bool { return time.Since(cutAt) >= cutFor }, "the cut did not last")
			attempts, cut := int(proxy.Dials()-dials), time.Since(cutAt)
			proxy.Heal()
			b.events.waitConnected(t, true)
			b.publish(t, jsonMessage("after"))
			testinfra.Eventually(t, 30*time.Second, func() bool { return b.effects(t, "after") == 1 }, "not processed after the cut")

			backoff := retry.Backoff{Base: cfg.OutageBaseDelay, Max: cfg.OutageMaxDelay}
			interval := cmp.Or(tc.logInterval, retry.DefaultLogInterval)
			t.Logf("broker cut for %s: %d connection attempts (at most %d), lines:\n%s", cut.Round(time.Millisecond),
				attempts, backoff.MaxAttempts(cut), logs.String(slog.LevelInfo))
			require.Greater(t, attempts, 1, "the consumer did not try to reconnect during the cut")
			// The window starts with the lost connection, not with an attempt: no slack needed.
			require.LessOrEqual(t, attempts, backoff.MaxAttempts(cut), "more attempts than the backoff allows")
			requireOutageLines(t, logs, cutAt, cut, interval, "rabbitmq consumer: broker connection")
			if tc.logInterval > 0 {
				still := linesSince(logs, cutAt, slog.LevelWarn, "rabbitmq consumer: broker connection: still failing")
				require.NotEmpty(t, still, "no line while the outage went on")
				require.Contains(t, still[0].Attrs, "failed_attempts=")
			}
			require.Len(t, linesSince(logs, cutAt, slog.LevelInfo, "consuming"), 1)
		})
	}

	// The holds: the database goes away under a consumer with a delivery in each of its
	// Prefetch slots. Each is held and retried in place, with the hold's backoff, for the
	// whole cut (MaxHold is the default 15 minutes); one line says so for all of them.
	t.Run("HeldDeliveries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool, proxy := b.proxiedPool(t)
		logger, logs := testinfra.NewLogs(t)
		cfg := b.config(recordEffect)
		// Each ack at once, before the Processed hook: waitProcessed then means acknowledged,
		// and no ack is still waiting to go out when the broker is cut.
		cfg.AckEvery = 1
		cfg.Logger = logger
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = 100*time.Millisecond, 500*time.Millisecond
		b.start(t, pool, cfg)
		b.publish(t, jsonMessage("before"))
		waitProcessed(t, b, 1) // and acknowledged: a lost ack would log a warning of its own

		failed := len(b.events.errors())
		cutAt := time.Now()
		proxy.Cut()
		for i := range cfg.Prefetch {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			held, _ := b.events.heldNow()
			return time.Since(cutAt) >= cutFor && held == cfg.Prefetch
		}, "the deliveries were not held through the cut")
		attempts, cut := len(b.events.errors())-failed, time.Since(cutAt)
		proxy.Heal()
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1+cfg.Prefetch && len(linesSince(logs, cutAt, slog.LevelInfo, "held deliveries: recovered")) == 1
		}, "the held deliveries were not processed after the cut")

		backoff := retry.Backoff{Base: cfg.RetryBaseDelay, Max: cfg.RetryMaxDelay} // the hold's, MaxHold being long
		t.Logf("database cut for %s: %d failed attempts for %d deliveries (at most %d each), lines:\n%s", cut.Round(time.Millisecond),
			attempts, cfg.Prefetch, backoff.MaxAttempts(cut), logs.String(slog.LevelInfo))
		require.GreaterOrEqual(t, attempts, 2*cfg.Prefetch, "the held deliveries were not retried during the cut")
		// Each delivery's attempts fall within the cut, which it arrived after.
		require.LessOrEqual(t, attempts, cfg.Prefetch*backoff.MaxAttempts(cut), "more attempts than the backoff allows")
		requireOutageLines(t, logs, cutAt, cut, retry.DefaultLogInterval, "rabbitmq consumer: held deliveries")
		require.Empty(t, b.events.handedBack())
		for i := range cfg.Prefetch {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
		}
	})

	// The holds again, with a MaxHold far shorter than the cut: every hold ends in a
	// hand-back, whose copy comes back and is held again, many times over. The cycles add up
	// to neither a flood of attempts nor of lines.
	t.Run("HandBackCycles", func(t *testing.T) {
		t.Parallel()
		const messages = 20
		b := setup(t)
		pool, proxy := b.proxiedPool(t)
		logger, logs := testinfra.NewLogs(t)
		cfg := b.config(recordEffect)
		// Each ack at once, before the Processed hook: waitProcessed then means acknowledged,
		// and no ack is still waiting to go out when the broker is cut.
		cfg.AckEvery = 1
		cfg.Logger = logger
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = 20*time.Millisecond, 100*time.Millisecond
		cfg.MaxHold = 300 * time.Millisecond
		b.start(t, pool, cfg)
		b.publish(t, jsonMessage("before"))
		waitProcessed(t, b, 1) // and acknowledged: a lost ack would log a warning of its own

		failed := len(b.events.errors())
		cutAt := time.Now()
		proxy.Cut()
		for i := range messages {
			b.publish(t, jsonMessage(fmt.Sprintf("order-%d", i)))
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			return time.Since(cutAt) >= cutFor && len(b.events.handedBack()) >= 2*cfg.Prefetch
		}, "the deliveries were not handed back during the cut")
		attempts, handBacks, cut := len(b.events.errors())-failed, len(b.events.handedBack()), time.Since(cutAt)
		proxy.Heal()
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == 1+messages && len(linesSince(logs, cutAt, slog.LevelInfo, "held deliveries: recovered")) == 1
		}, "the deliveries were not processed after the cut")

		// A hold lasts at most MaxHold from its delivery's arrival, and at least 3/4 of it:
		// it ends when the next wait (at most MaxHold/4) would pass MaxHold. Half of it, for
		// the time between a delivery's arrival and its worker.
		backoff := retry.Backoff{Base: cfg.RetryBaseDelay, Max: cfg.MaxHold / 4} // the hold's
		perHold := backoff.MaxAttempts(cfg.MaxHold)
		maxHandBacks := cfg.Prefetch * (int(cut/(cfg.MaxHold/2)) + 1)
		t.Logf("database cut for %s: %d failed attempts, %d hand-backs (at most %d, and %d attempts a hold), lines:\n%s",
			cut.Round(time.Millisecond), attempts, handBacks, maxHandBacks, perHold, logs.String(slog.LevelInfo))
		require.LessOrEqual(t, handBacks, maxHandBacks, "holds were handed back early")
		// Each hold is one of the ones handed back or one still open at the heal.
		require.LessOrEqual(t, attempts, (handBacks+cfg.Prefetch)*perHold, "more attempts than the backoff allows")
		requireOutageLines(t, logs, cutAt, cut, retry.DefaultLogInterval, "rabbitmq consumer: held deliveries")
		for _, r := range b.events.handedBack() {
			require.Equal(t, inboxrabbitmq.HandBackHoldLimit, r)
		}
		for i := range messages {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("order-%d", i)))
		}
	})
}

// waitProcessed waits until n messages were processed: acknowledged too with AckEvery 1.
func waitProcessed(t *testing.T, b *bundle, n int) {
	t.Helper()
	testinfra.Eventually(t, 30*time.Second, func() bool {
		processed, _ := b.events.counts()
		return processed == n
	}, "%d messages were not processed", n)
}

// requireOutageLines checks the lines logged since an outage of length cut began at
// cutAt: at warning level, one when the loop named what started failing and at most one
// per interval after it, and nothing else; one line when it recovered.
func requireOutageLines(t *testing.T, logs *testinfra.Logs, cutAt time.Time, cut, interval time.Duration, what string) {
	t.Helper()
	warnings := linesSince(logs, cutAt, slog.LevelWarn, "")
	require.LessOrEqual(t, len(warnings), 1+int(cut/interval), "more warnings than one per log interval:\n%s", logs.String(slog.LevelWarn))
	require.Len(t, linesSince(logs, cutAt, slog.LevelWarn, what+": failing; retrying with backoff"), 1, "%s", logs.String(slog.LevelWarn))
	for _, r := range warnings {
		require.True(t, strings.HasPrefix(r.Msg, what+": "), "a warning of another kind: %q %s", r.Msg, r.Attrs)
	}
	require.Len(t, linesSince(logs, cutAt, slog.LevelInfo, what+": recovered"), 1, "%s", logs.String(slog.LevelInfo))
}

// linesSince returns the lines at level or above, logged at since or later, whose message
// contains msg.
func linesSince(logs *testinfra.Logs, since time.Time, level slog.Level, msg string) []testinfra.LogRecord {
	var out []testinfra.LogRecord
	for _, r := range logs.Records() {
		if !r.Time.Before(since) && r.Level >= level && strings.Contains(r.Msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

package app_test

import (
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/orders/app"
)

// TestIdempotencyKeyCleanupBacksOff cuts the database of a running API for a few seconds:
// the idempotency key cleanup retries with the periodic jobs' backoff, never more often than
// it allows, logs the outage once and its end once. A cleanup that retried without a delay
// would count thousands of failed runs.
func TestIdempotencyKeyCleanupBacksOff(t *testing.T) {
	t.Parallel()
	const (
		job      = "idempotency key cleanup"
		interval = time.Second
		cut      = 3 * time.Second
	)
	cfg := testConfig(t)
	direct := cfg.DatabaseURL
	db, _ := proxied(t, &cfg)
	cfg.IdempotencyKeyCleanupInterval = interval
	cfg.IdempotencyKeyRetention = time.Hour
	logger, logs := testinfra.NewLogs(t)
	a, err := app.New(cfg, app.ModeAPI, app.Options{Logger: logger})
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop()) })

	// Healthy: an expired key is deleted.
	conn, err := pgx.Connect(context.Background(), direct)
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(),
		`INSERT INTO idempotency_keys (key, request_hash, created_at) VALUES ('expired', '\x00', now() - interval '2 hours')`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
	testinfra.Eventually(t, 10*time.Second, func() bool { return logs.Count(slog.LevelInfo, "idempotency keys deleted") >= 1 },
		"the cleanup runs")

	db.Cut()
	<-time.After(cut) // the outage's length, not a synchronisation
	db.Heal()
	testinfra.Eventually(t, 20*time.Second, func() bool { return logs.Count(slog.LevelInfo, job+": recovered") == 1 },
		"the cleanup recovers once the database is back")

	var lines []testinfra.LogRecord
	for _, r := range logs.Records() {
		if strings.HasPrefix(r.Msg, job+": ") {
			lines = append(lines, r)
		}
	}
	require.NotEmpty(t, lines)
	first, last := lines[0], lines[len(lines)-1]
	require.Contains(t, first.Msg, "failing", "the first line opens the streak")
	require.Equal(t, slog.LevelWarn, first.Level)
	require.Equal(t, job+": recovered", last.Msg)
	m := regexp.MustCompile(`failed_attempts=(\d+)`).FindStringSubmatch(last.Attrs)
	require.NotNil(t, m, last.Attrs)
	failed, err := strconv.Atoi(m[1])
	require.NoError(t, err)

	// Every failed run lies between the first line and the recovery (later than the cut
	// itself while the pool reconnects); the wait after one is min(backoff, interval).
	window := last.Time.Sub(first.Time)
	bound := retry.Backoff{Base: service.DefaultOutageBaseDelay, Max: min(service.DefaultOutageMaxDelay, interval)}.MaxAttempts(window)
	warns := 0
	for _, r := range lines {
		if r.Level >= slog.LevelWarn {
			warns++
		}
	}
	t.Logf("%d failed runs in %s (at most %d), %d Warn lines", failed, window.Round(time.Millisecond), bound, warns)
	require.LessOrEqual(t, failed, bound, "failed runs in %s", window)
	require.LessOrEqual(t, warns, 1+int(window/retry.DefaultLogInterval), "Warn lines:\n%s", logs.String(slog.LevelWarn))
}

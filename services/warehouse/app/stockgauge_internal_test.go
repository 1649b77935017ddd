package app

import (
	"context"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// countingReader counts the reads of a stockReader, and those that succeeded.
type countingReader struct {
	stockReader
	calls, ok atomic.Int64
}

func (c *countingReader) Available(ctx context.Context, skus []string) (map[string]int64, error) {
	c.calls.Add(1)
	levels, err := c.stockReader.Available(ctx, skus)
	if err == nil {
		c.ok.Add(1)
	}
	return levels, err
}

// TestStockGaugeBacksOff runs the stock gauge as the API runs it (service.Every) on a
// database behind a proxy, and cuts it for a few seconds: the gauge reads no more often than
// the backoff allows, logs the outage once per log interval and its end once. A gauge that
// retried without a delay would read thousands of times. It runs the job on its own, with
// an interval and a log interval shorter than the API's (StockMetricsInterval, 30s), so that
// a short outage spans several runs and lines.
func TestStockGaugeBacksOff(t *testing.T) {
	t.Parallel()
	const (
		interval    = time.Second
		logInterval = time.Second
		cut         = 3 * time.Second
	)
	u, err := url.Parse(testinfra.DatabaseURL(t))
	require.NoError(t, err)
	proxy := testinfra.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	pool, err := pgdb.Open(context.Background(), pgdb.Config{URL: u.String(), MaxConns: 2, Migrate: postgres.Migrate})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc, err := newServiceMetrics(service.NewProcess(ServiceName, "api", service.Options{}))
	require.NoError(t, err)
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	reader := &countingReader{stockReader: store}

	logger, logs := testinfra.NewLogs(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- service.Every(ctx, service.Job{
			Name: "stock metrics", Interval: interval, LogInterval: logInterval, Logger: logger, Run: svc.stockGauge(reader),
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	testinfra.Eventually(t, 10*time.Second, func() bool { return reader.ok.Load() >= 2 }, "healthy reads")
	before := reader.calls.Load()
	proxy.Cut()
	<-time.After(cut) // the outage's length, not a synchronisation
	during := reader.calls.Load() - before
	proxy.Heal()
	testinfra.Eventually(t, 20*time.Second, func() bool { return logs.Count(slog.LevelInfo, "stock metrics: recovered") == 1 },
		"the gauge recovers once the database is back")

	// The wait after a failed read is min(backoff, interval). +1: the read under way when
	// the cut began.
	bound := retry.Backoff{Base: service.DefaultOutageBaseDelay, Max: min(service.DefaultOutageMaxDelay, interval)}.MaxAttempts(cut) + 1
	warns := logs.Count(slog.LevelWarn, "stock metrics: ")
	t.Logf("%d reads in a %s outage (at most %d), %d Warn lines", during, cut, bound, warns)
	require.LessOrEqual(t, during, int64(bound), "reads in a %s outage", cut)
	require.GreaterOrEqual(t, warns, 1, "the outage is logged")
	require.LessOrEqual(t, warns, 1+int(cut/logInterval), "Warn lines:\n%s", logs.String(slog.LevelDebug))
	require.Equal(t, logs.Count(slog.LevelWarn, ""), warns, "no other lines")
}

package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
)

// Defaults for [CleanupConfig]: each field says what they mean.
const (
	DefaultCleanupRetention = 7 * 24 * time.Hour
	DefaultCleanupBatchSize = 1000
	DefaultCleanupInterval  = time.Minute
)

// CleanupConfig configures [Cleanup] and [RunCleanup]. The zero value of every field means
// its default; [CleanupConfig.WithDefaults] returns what they will use.
type CleanupConfig struct {
	// Retention is how long published rows are kept (pending and dead rows are never
	// deleted), to look up what was sent. Default 7 days ([DefaultCleanupRetention]).
	Retention time.Duration
	// BatchSize is the most rows one DELETE statement removes, so that none holds locks for
	// long. Default 1000 ([DefaultCleanupBatchSize]).
	BatchSize int
	// Interval is the time between two runs of RunCleanup. Default 1m
	// ([DefaultCleanupInterval]).
	Interval time.Duration
	// Logger receives a line per run that deleted rows and the lines of a failure streak
	// (RunCleanup), and a debug line per batch. Nil discards.
	Logger *slog.Logger
}

// WithDefaults returns c with every default filled in, or an error for an invalid field.
func (c CleanupConfig) WithDefaults() (CleanupConfig, error) {
	switch {
	case c.Retention < 0:
		return c, fmt.Errorf("outbox: cleanup retention must be >= 0 (0 means %s), got %s", DefaultCleanupRetention, c.Retention)
	case c.BatchSize < 0:
		return c, fmt.Errorf("outbox: cleanup batch size must be >= 0 (0 means %d), got %d", DefaultCleanupBatchSize, c.BatchSize)
	case c.Interval < 0:
		return c, fmt.Errorf("outbox: cleanup interval must be >= 0 (0 means %s), got %s", DefaultCleanupInterval, c.Interval)
	}
	c.Retention = cmp.Or(c.Retention, DefaultCleanupRetention)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultCleanupBatchSize)
	c.Interval = cmp.Or(c.Interval, DefaultCleanupInterval)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c, nil
}

// cleanupCutoff computes the cutoff once per run, on the database clock, so that the clocks
// of the application hosts do not matter and a run does not chase rows published while it
// deletes. $1 retention in seconds.
const cleanupCutoff = `SELECT now() - make_interval(secs => $1)`

// deletePublished removes at most $2 rows published before $1. The subquery walks the
// published_at index; SKIP LOCKED lets several cleaners run side by side without waiting for
// each other. Pending and dead rows are never touched.
const deletePublished = `
DELETE FROM {{.Messages}}
WHERE id IN (
  SELECT id FROM {{.Messages}}
  WHERE published_at IS NOT NULL AND published_at < $1
  ORDER BY published_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED)`

// Cleanup deletes the rows published more than cfg.Retention ago, in short DELETEs of at
// most cfg.BatchSize rows, and returns how many it deleted; when ctx ends between batches,
// it returns those and ctx's error.
func Cleanup(ctx context.Context, db DBTX, cfg CleanupConfig) (deleted int64, err error) {
	return defaultStore.Cleanup(ctx, db, cfg)
}

// Cleanup is [Cleanup] for the store's table.
func (s *Store) Cleanup(ctx context.Context, db DBTX, cfg CleanupConfig) (deleted int64, err error) {
	cfg, err = cfg.WithDefaults()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, s.sql.cleanupCutoff, cfg.Retention.Seconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("clean up outbox: compute cutoff: %w", err)
	}
	for {
		tag, err := db.Exec(ctx, s.sql.deletePublished, cutoff, cfg.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("clean up outbox: delete batch: %w", err)
		}
		n := tag.RowsAffected()
		deleted += n
		cfg.Logger.DebugContext(ctx, "outbox cleanup batch", slog.Int64("deleted", n), slog.Time("cutoff", cutoff))
		if n < int64(cfg.BatchSize) {
			return deleted, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("clean up outbox: %w", err)
		}
	}
}

// RunCleanup calls [Cleanup] at once and then every cfg.Interval until ctx is done, and then
// returns nil; an invalid cfg returns an error at once. A failed run is retried with the
// relay's default outage backoff ([Config].OutageBaseDelay), never later than the interval,
// and logged once per failure streak (README.md#operations). Concurrent cleaners skip each
// other's rows.
func RunCleanup(ctx context.Context, db DBTX, cfg CleanupConfig) error {
	return defaultStore.RunCleanup(ctx, db, cfg)
}

// RunCleanup is [RunCleanup] for the store's table.
func (s *Store) RunCleanup(ctx context.Context, db DBTX, cfg CleanupConfig) error {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return err
	}
	failures := &retry.Streak{What: "outbox cleanup", Logger: cfg.Logger,
		Backoff: retry.Backoff{Base: DefaultOutageBaseDelay, Max: DefaultOutageMaxDelay}}
	for {
		start := time.Now()
		deleted, err := s.Cleanup(ctx, db, cfg)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil: // the backoff from now: a run that timed out took long to fail
			wait = min(failures.Fail(ctx, err), cfg.Interval)
		default: // the interval from the run's start
			failures.Succeed(ctx)
			if deleted > 0 {
				cfg.Logger.InfoContext(ctx, "outbox cleanup", slog.Int64("deleted", deleted), slog.Duration("took", time.Since(start)))
			}
			wait = cfg.Interval - time.Since(start)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

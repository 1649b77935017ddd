package outbox

import (
	"cmp"
	"context"
	"errors"
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
	// PartitionsAhead is, for a partitioned table ([Tables.Partition]), how far ahead of now
	// Cleanup keeps partitions made. Default: three partitions, and at least an hour. Keep it
	// well above 30 minutes, the OutboxPartitionsRunningOut alert's threshold.
	PartitionsAhead time.Duration
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
	case c.PartitionsAhead < 0:
		return c, fmt.Errorf("outbox: cleanup's partitions ahead must be >= 0 (0 means three partitions, and at least an hour), got %s", c.PartitionsAhead)
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
//
// On a partitioned table it deletes only rows created before $3, in the partitions old
// enough to be dropped: those kept for their pending or dead rows. The newer partitions are
// left whole for their drop (and not read: $3 prunes them).
const deletePublished = `
DELETE FROM {{.Messages}}
WHERE {{if .Partitioned}}(id, created_at){{else}}id{{end}} IN (
  SELECT {{if .Partitioned}}id, created_at{{else}}id{{end}} FROM {{.Messages}}
  WHERE published_at IS NOT NULL AND published_at < $1{{if .Partitioned}} AND created_at < $3{{end}}
  ORDER BY published_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED){{if .Partitioned}}
  AND created_at < $3{{end}}`

// Cleanup deletes the rows published more than cfg.Retention ago, in short DELETEs of at
// most cfg.BatchSize rows, and returns how many it deleted; when ctx ends between batches,
// it returns those and ctx's error. On a partitioned table ([Tables.Partition]) it first
// makes the partitions of the next cfg.PartitionsAhead, and drops whole the partitions whose
// range ended more than cfg.Retention ago and that hold no pending or dead row, counting
// their rows as deleted (README.md#partitioned-tables).
func Cleanup(ctx context.Context, db DBTX, cfg CleanupConfig) (deleted int64, err error) {
	return defaultStore.Cleanup(ctx, db, cfg)
}

// Cleanup is [Cleanup] for the store's table.
func (s *Store) Cleanup(ctx context.Context, db DBTX, cfg CleanupConfig) (deleted int64, err error) {
	cfg, err = cfg.WithDefaults()
	if err != nil {
		return 0, err
	}
	if p := s.tables.Partition; p != 0 && cfg.Retention < p {
		return 0, fmt.Errorf("outbox: cleanup retention %s is shorter than a partition (%s): a transaction that began in a partition's range could find it dropped", cfg.Retention, p)
	}
	// A partitioned table's partitions first, so that a run that fails later has still made
	// them. A partition not made (its lock not had in time: a long transaction on the table)
	// fails the run, but only once the rest of it is done.
	var notMade error
	if err := checkLayoutOn(ctx, db, s); err != nil {
		return 0, fmt.Errorf("clean up outbox: %w", err)
	}
	if s.tables.Partition != 0 {
		if _, err := s.createPartitions(ctx, db, cfg.PartitionsAhead, cfg.Logger); err != nil {
			notMade = fmt.Errorf("clean up outbox: %w", err)
		}
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, s.sql.cleanupCutoff, cfg.Retention.Seconds()).Scan(&cutoff); err != nil {
		return 0, errors.Join(notMade, fmt.Errorf("clean up outbox: compute cutoff: %w", err))
	}
	args := []any{cutoff, cfg.BatchSize}
	if s.tables.Partition != 0 {
		var another bool
		if deleted, another, err = s.dropPartitions(ctx, db, cutoff, cfg.Logger); err != nil {
			return deleted, errors.Join(notMade, fmt.Errorf("clean up outbox: %w", err))
		}
		if another {
			// Another process is dropping partitions: the rows of those it has not dropped
			// yet are left to their drop, not deleted one by one, and its DELETE follows.
			return deleted, notMade
		}
		args = append(args, droppableBefore(cutoff, s.tables.Partition))
	}
	defer func() { err = errors.Join(notMade, err) }()
	for {
		tag, err := db.Exec(ctx, s.sql.deletePublished, args...)
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

package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

// Execer runs single statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults for [CleanupConfig], as the outbox's; each field's doc says what it means.
const (
	DefaultCleanupRetention = 7 * 24 * time.Hour
	DefaultCleanupBatchSize = 1000
	DefaultCleanupInterval  = 10 * time.Minute
)

// The outage backoff of [RunCleanup] while the database is unavailable: DefaultOutageBaseDelay
// after the first failed run, doubling up to DefaultOutageMaxDelay, jittered down to half.
const (
	DefaultOutageBaseDelay = 100 * time.Millisecond
	DefaultOutageMaxDelay  = 10 * time.Second
)

// CleanupConfig configures [Cleanup] and [RunCleanup]. The zero value of every field means
// its default.
type CleanupConfig struct {
	// Retention is how long a processed message is remembered. It must exceed the longest
	// time in which the same message can still arrive again (broker redeliveries, retries, a
	// producer's outbox republishing after a crash, a replay of dead letters): a duplicate
	// that arrives after its row was deleted is applied a second time. Default 7 days, far
	// beyond every automatic redelivery; set it above the longest replay you may run.
	Retention time.Duration
	// BatchSize is the most rows one DELETE statement removes, so that no statement holds
	// locks for long. Default 1000.
	BatchSize int
	// Interval is the time between two runs of RunCleanup. Default 10 minutes.
	Interval time.Duration
	// Logger receives a line per run that deleted rows, a debug line per batch, and a
	// failure streak's lines (once when runs start failing, at most every 30 seconds while
	// they go on, once when one succeeds again). Nil discards.
	Logger *slog.Logger
	// PartitionsAhead is, for a partitioned table ([Tables.Partition]), how far ahead of now
	// Cleanup keeps partitions made. Default: three partitions, and at least an hour. Keep it
	// well above 30 minutes, the InboxPartitionsRunningOut alert's threshold.
	PartitionsAhead time.Duration
}

// WithDefaults returns c validated, with every default filled in: what [Cleanup] and
// [RunCleanup] will use, which call it.
func (c CleanupConfig) WithDefaults() (CleanupConfig, error) {
	switch {
	case c.Retention < 0:
		return c, fmt.Errorf("inbox: cleanup retention must be >= 0 (0 means %s), got %s", DefaultCleanupRetention, c.Retention)
	case c.BatchSize < 0:
		return c, fmt.Errorf("inbox: cleanup batch size must be >= 0 (0 means %d), got %d", DefaultCleanupBatchSize, c.BatchSize)
	case c.Interval < 0:
		return c, fmt.Errorf("inbox: cleanup interval must be >= 0 (0 means %s), got %s", DefaultCleanupInterval, c.Interval)
	case c.PartitionsAhead < 0:
		return c, fmt.Errorf("inbox: cleanup's partitions ahead must be >= 0 (0 means three partitions, and at least an hour), got %s", c.PartitionsAhead)
	}
	c.Retention = cmp.Or(c.Retention, DefaultCleanupRetention)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultCleanupBatchSize)
	c.Interval = cmp.Or(c.Interval, DefaultCleanupInterval)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c, nil
}

// SQL run by Cleanup.
const (
	// cleanupCutoffSQL computes the cutoff once per run, on the database clock, so that the
	// clocks of the application hosts do not matter and a run does not chase rows processed
	// while it deletes. $1 retention in seconds.
	cleanupCutoffSQL = `SELECT now() - make_interval(secs => $1)`

	// cleanupBatchSQL deletes at most $2 rows processed before $1. The subquery walks the
	// processed_at index; SKIP LOCKED lets several cleaners run side by side without waiting
	// for each other.
	cleanupBatchSQL = `DELETE FROM {{.Messages}}
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM {{.Messages}}
    WHERE processed_at < $1
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`
)

// Cleanup deletes the inbox rows processed more than cfg.Retention ago and returns how many
// it deleted: in batches of at most cfg.BatchSize rows, one short DELETE statement each,
// committed on its own unless db is a transaction, until a batch comes back short, so that it
// can run while consumers are busy. An invalid cfg returns an error without deleting
// anything; when ctx ends between batches, Cleanup returns the rows deleted so far and ctx's
// error. On a partitioned table ([Tables.Partition]) it deletes no row: it drops whole the
// partitions whose range ended more than cfg.Retention ago (not while a transaction that
// began in its range is open), counting their rows as deleted, and makes the partitions of
// the next cfg.PartitionsAhead; the rows of the others stay up to a partition's length past
// their retention. There db must be a pool or a connection, on which it runs transactions and
// statements of its own (README.md#partitioned-tables). It cleans the table of the default
// [Tables]; [Store.Cleanup] another.
func Cleanup(ctx context.Context, db Execer, cfg CleanupConfig) (deleted int64, err error) {
	return defaultStore.Cleanup(ctx, db, cfg)
}

// Cleanup is [Cleanup] for the store's table.
func (s *Store) Cleanup(ctx context.Context, db Execer, cfg CleanupConfig) (deleted int64, err error) {
	cfg, err = cfg.WithDefaults()
	if err != nil {
		return 0, err
	}
	if p := s.tables.Partition; p != 0 && cfg.Retention < p {
		return 0, fmt.Errorf("inbox: cleanup retention %s is shorter than a partition (%s): a transaction that began in a partition's range could find it dropped", cfg.Retention, p)
	}
	if s.tables.Partition != 0 {
		if err := s.checkPartitions(cfg.Retention, cfg.PartitionsAhead); err != nil {
			return 0, err
		}
	}
	if err := checkLayoutOn(ctx, db, s); err != nil {
		return 0, fmt.Errorf("cleanup: %w", err)
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, s.sql.cleanupCutoff, cfg.Retention.Seconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("cleanup: compute cutoff: %w", err)
	}
	if s.tables.Partition != 0 {
		// The drops first: they finish what an earlier run left undone, such as a partition
		// left apart that keeps the name of one to make. A drop that fails (a transaction on
		// the table that lasts) does not stop the partitions' making; a partition not made
		// (its lock not had in time) fails the run, as the drop does, once both are done.
		deleted, dropErr := s.dropPartitions(ctx, db, cutoff, cfg.Logger)
		if dropErr != nil {
			dropErr = fmt.Errorf("cleanup: %w", dropErr)
		}
		var madeErr error
		if _, err := s.createPartitions(ctx, db, cfg.PartitionsAhead, cfg.Logger); err != nil {
			madeErr = fmt.Errorf("cleanup: %w", err)
		}
		return deleted, errors.Join(dropErr, madeErr)
	}
	// One batch after another, without a wait, until one comes back short; not a retry loop:
	// an error ends the run (RunCleanup backs off before the next).
	for {
		tag, err := db.Exec(ctx, s.sql.cleanupBatch, cutoff, cfg.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("cleanup: delete batch: %w", err)
		}
		n := tag.RowsAffected()
		deleted += n
		cfg.Logger.DebugContext(ctx, "inbox cleanup batch", slog.Int64("deleted", n), slog.Time("cutoff", cutoff))
		if n < int64(cfg.BatchSize) {
			return deleted, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("cleanup: %w", err)
		}
	}
}

// RunCleanup calls [Cleanup] at once and then every cfg.Interval until ctx is done, and then
// returns nil; an invalid cfg returns an error at once. A failed run is retried after the
// outage backoff ([DefaultOutageBaseDelay]), never later than the interval. Run it in one or
// more processes per database: concurrent cleaners skip each other's rows. It cleans the
// table of the default [Tables]; [Store.RunCleanup] another.
func RunCleanup(ctx context.Context, db Execer, cfg CleanupConfig) error {
	return defaultStore.RunCleanup(ctx, db, cfg)
}

// RunCleanup is [RunCleanup] for the store's table.
func (s *Store) RunCleanup(ctx context.Context, db Execer, cfg CleanupConfig) error {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return err
	}
	// The loop's wait: after a failure, the outage backoff capped at the interval; after a
	// success, the interval.
	failures := &retry.Streak{What: "inbox cleanup", Logger: cfg.Logger,
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
				cfg.Logger.InfoContext(ctx, "inbox cleanup", slog.Int64("deleted", deleted), slog.Duration("took", time.Since(start)))
			}
			wait = cfg.Interval - time.Since(start)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

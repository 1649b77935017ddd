package inbox

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs single statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
//
// [Cleanup] runs each batch as its own statement; given a pool or a connection outside a
// transaction, each batch commits on its own and holds its locks only for that statement.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults for [CleanupConfig].
const (
	DefaultCleanupBatchSize = 1000
	DefaultCleanupInterval  = 10 * time.Minute
)

// CleanupConfig configures [Cleanup] and [RunCleanup].
type CleanupConfig struct {
	// Retention is how long a processed message is remembered. Required, > 0.
	//
	// It must exceed the longest time in which the same message can still arrive again:
	// broker redeliveries, retries, a producer's outbox republishing after a crash, a
	// replay of dead letters. A duplicate that arrives after its row was deleted is not
	// recognised and is applied a second time. Days, not minutes.
	Retention time.Duration
	// BatchSize is the most rows one DELETE statement removes. Default 1000.
	BatchSize int
	// Interval is the time between two runs of RunCleanup. Default 10 minutes.
	Interval time.Duration
	// Logger receives a line per run that deleted rows and per failed run (RunCleanup). Nil
	// discards.
	Logger *slog.Logger
}

func (c CleanupConfig) withDefaults() (CleanupConfig, error) {
	if c.Retention <= 0 {
		return c, fmt.Errorf("inbox: cleanup retention must be > 0, got %s", c.Retention)
	}
	if c.BatchSize < 0 {
		return c, fmt.Errorf("inbox: cleanup batch size must be >= 0 (0 means %d), got %d", DefaultCleanupBatchSize, c.BatchSize)
	}
	if c.Interval < 0 {
		return c, fmt.Errorf("inbox: cleanup interval must be >= 0 (0 means %s), got %s", DefaultCleanupInterval, c.Interval)
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultCleanupBatchSize)
	c.Interval = cmp.Or(c.Interval, DefaultCleanupInterval)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return c, nil
}

// SQL run by Cleanup.
const (
	// cleanupCutoffSQL computes the cutoff once per run, on the database clock, so that the
	// clocks of the application hosts do not matter. $1 retention in seconds.
	cleanupCutoffSQL = `SELECT now() - make_interval(secs => $1)`

	// cleanupBatchSQL deletes at most $2 rows processed before $1. The subquery walks the
	// processed_at index; SKIP LOCKED lets several cleaners run side by side without waiting
	// for each other.
	cleanupBatchSQL = `DELETE FROM inbox_messages
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM inbox_messages
    WHERE processed_at < $1
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`
)

// Cleanup deletes the inbox rows processed more than cfg.Retention ago and returns how many
// it deleted. It deletes in batches of at most cfg.BatchSize rows, one short DELETE statement
// each, until a batch comes back short, so it never holds many locks for long and can run
// while consumers are busy.
//
// The retention must exceed the longest redelivery window: a duplicate arriving after its
// inbox row was deleted would be applied twice. See [CleanupConfig].Retention.
//
// A retention <= 0 returns an error without deleting anything. When ctx ends between batches,
// Cleanup returns the rows deleted so far and ctx's error.
func Cleanup(ctx context.Context, db Execer, cfg CleanupConfig) (deleted int64, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, cleanupCutoffSQL, cfg.Retention.Seconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("inbox: cleanup: compute cutoff: %w", err)
	}
	for {
		tag, err := db.Exec(ctx, cleanupBatchSQL, cutoff, cfg.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("inbox: cleanup: delete batch: %w", err)
		}
		n := tag.RowsAffected()
		deleted += n
		cfg.Logger.DebugContext(ctx, "inbox cleanup batch", slog.Int64("deleted", n), slog.Time("cutoff", cutoff))
		if n < int64(cfg.BatchSize) {
			return deleted, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("inbox: cleanup: %w", err)
		}
	}
}

// RunCleanup calls [Cleanup] at once and then every cfg.Interval until ctx is done, and then
// returns nil. A failed run is logged and retried at the next interval. An invalid cfg
// (retention <= 0) returns an error at once.
//
// Run it in one or more processes per database; concurrent cleaners skip each other's rows.
func RunCleanup(ctx context.Context, db Execer, cfg CleanupConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	ticker := time.NewTicker(cfg.Interval)
	defer ticker.Stop()
	for {
		start := time.Now()
		deleted, err := Cleanup(ctx, db, cfg)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			cfg.Logger.ErrorContext(ctx, "inbox cleanup failed", slog.Int64("deleted", deleted), slog.Any("error", err))
		case deleted > 0:
			cfg.Logger.InfoContext(ctx, "inbox cleanup", slog.Int64("deleted", deleted), slog.Duration("took", time.Since(start)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

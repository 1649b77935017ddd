package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Stats is a snapshot of the outbox table.
type Stats struct {
	// Pending counts rows not yet published and not dead: the backlog.
	Pending int64
	// OldestPending is when the oldest pending row was written; zero when none is pending.
	OldestPending time.Time
	// Dead counts rows that gave up.
	Dead int64
}

// statsQuery reads the pending rows once through their partial index, and the dead ones
// through theirs: its cost is the backlog plus the dead rows, however many published rows the
// table keeps (a few milliseconds for 50,000 pending rows). The oldest pending row is the one
// with the earliest created_at, not the smallest seq: a row's seq is taken when it is
// inserted, its created_at when its transaction began, so a long transaction's row can be
// older than rows ahead of it.
const statsQuery = `
SELECT p.pending, p.oldest, (SELECT count(*) FROM outbox_messages WHERE dead_at IS NOT NULL)
FROM (SELECT count(*) AS pending, min(created_at) AS oldest
      FROM outbox_messages WHERE published_at IS NULL AND dead_at IS NULL) p`

// ReadStats returns the backlog, the age of its oldest row and the number of dead rows. It is
// meant to be called at an interval by a process other than the relay (for metrics), so that
// a dead relay's growing backlog stays visible.
func ReadStats(ctx context.Context, db DBTX) (Stats, error) {
	var (
		s      Stats
		oldest *time.Time
	)
	if err := db.QueryRow(ctx, statsQuery).Scan(&s.Pending, &oldest, &s.Dead); err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	if oldest != nil {
		s.OldestPending = *oldest
	}
	return s, nil
}

// DeadMessage is a row that gave up, with why.
type DeadMessage struct {
	Message
	LastError string
	DeadAt    time.Time
}

const listDead = `
SELECT id, exchange, routing_key, type, aggregate_type, aggregate_id, payload::text, headers::text,
       created_at, attempts, coalesce(last_error, ''), dead_at
FROM outbox_messages
WHERE dead_at IS NOT NULL
ORDER BY dead_at, seq
LIMIT $1`

// ListDead returns up to limit dead rows, the longest dead first.
//
// Rows die for being unreadable too, so ListDead reads whatever a row holds: a header whose
// value is not a string (written by hand, or by other code) is returned as its JSON text, and
// headers that are not a JSON object at all are returned under the key "" as they are.
func ListDead(ctx context.Context, db DBTX, limit int) ([]DeadMessage, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list dead outbox rows: limit %d must be positive", limit)
	}
	rows, err := db.Query(ctx, listDead, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	dead, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadMessage, error) {
		var (
			d       DeadMessage
			payload []byte
			headers []byte
		)
		err := row.Scan(&d.ID, &d.Exchange, &d.RoutingKey, &d.Type, &d.AggregateType, &d.AggregateID,
			&payload, &headers, &d.CreatedAt, &d.Attempts, &d.LastError, &d.DeadAt)
		d.Payload = payload
		d.Headers = readableHeaders(headers)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	return dead, nil
}

// readableHeaders decodes a headers column for display, whatever it holds.
func readableHeaders(raw []byte) map[string]string {
	var strs map[string]string
	if json.Unmarshal(raw, &strs) == nil {
		return strs
	}
	var values map[string]json.RawMessage
	if json.Unmarshal(raw, &values) != nil {
		return map[string]string{"": string(raw)}
	}
	out := make(map[string]string, len(values))
	for k, v := range values {
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			out[k] = s
			continue
		}
		out[k] = string(v)
	}
	return out
}

// requeueDead gives dead rows a fresh set of attempts. last_error stays for the record.
const requeueDead = `
WITH requeued AS (
  UPDATE outbox_messages
  SET dead_at = NULL, attempts = 0, next_attempt_at = now(), waiting = false
  WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL
  RETURNING 1
)
SELECT count(*), pg_notify('outbox_messages', '') FROM requeued`

// Requeue makes the given dead rows pending again with a fresh set of attempts, so that an
// operator can replay them after fixing the cause. Ids that are not dead are ignored; the
// count of requeued rows is returned.
//
// A requeued row is published after rows of its aggregate that were written later and
// already published: see "Ordering" in the package documentation.
func Requeue(ctx context.Context, db DBTX, ids ...uuid.UUID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.String()
	}
	var n int64
	var notified any
	if err := db.QueryRow(ctx, requeueDead, strs).Scan(&n, &notified); err != nil {
		return 0, fmt.Errorf("requeue dead outbox rows: %w", err)
	}
	return n, nil
}

// CleanupConfig tunes [Cleanup] and [RunCleanup].
type CleanupConfig struct {
	// Retention is how long published rows are kept. Default 7 days.
	Retention time.Duration
	// BatchSize bounds the rows one DELETE removes, so that no statement holds locks for
	// long. Default 1000.
	BatchSize int
	// Interval is how often RunCleanup runs. Default 1 minute.
	Interval time.Duration
	// Logger receives a line for each pass that deleted something, and errors. nil discards.
	Logger *slog.Logger
}

func (c CleanupConfig) withDefaults() (CleanupConfig, error) {
	c.Retention = cmp.Or(c.Retention, 7*24*time.Hour)
	c.BatchSize = cmp.Or(c.BatchSize, 1000)
	c.Interval = cmp.Or(c.Interval, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Retention < 0 || c.BatchSize < 0 || c.Interval < 0 {
		return c, errors.New("outbox cleanup: negative Retention, BatchSize or Interval")
	}
	return c, nil
}

// deletePublished removes one bounded batch of old published rows. Pending and dead rows are
// never touched.
const deletePublished = `
DELETE FROM outbox_messages
WHERE id IN (
  SELECT id FROM outbox_messages
  WHERE published_at IS NOT NULL AND published_at < now() - $1 * interval '1 millisecond'
  ORDER BY published_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED)`

// Cleanup deletes published rows older than the retention, one bounded batch per statement,
// until none is left. It returns how many rows it deleted.
func Cleanup(ctx context.Context, db DBTX, cfg CleanupConfig) (int64, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, deletePublished, cfg.Retention.Milliseconds(), cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("delete published outbox rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(cfg.BatchSize) {
			return total, nil
		}
	}
}

// RunCleanup calls [Cleanup] every cfg.Interval until ctx is cancelled, and then returns nil.
// Errors are logged and retried at the next interval.
func RunCleanup(ctx context.Context, db DBTX, cfg CleanupConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		n, err := Cleanup(ctx, db, cfg)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			cfg.Logger.WarnContext(ctx, "outbox cleanup failed", "error", err)
		case n > 0:
			cfg.Logger.InfoContext(ctx, "outbox cleanup", "deleted", n, "retention", cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// DeadMessage is a row that gave up, with why.
type DeadMessage struct {
	Message
	LastError string
	DeadAt    time.Time
}

// listDead reads the dead rows through their partial index, the longest dead first.
const listDead = `
SELECT id, exchange, routing_key, type, aggregate_type, aggregate_id, payload::text, headers::text,
       created_at, attempts, coalesce(last_error, ''), dead_at
FROM {{.Messages}}
WHERE dead_at IS NOT NULL
ORDER BY dead_at, seq
LIMIT $1`

// ListDead returns up to limit dead rows, the longest dead first, whatever they hold: a
// header that is not a string as its JSON text, headers that are not a JSON object under
// the key "".
func ListDead(ctx context.Context, db DBTX, limit int) ([]DeadMessage, error) {
	return defaultStore.ListDead(ctx, db, limit)
}

// ListDead is [ListDead] for the store's table.
func (s *Store) ListDead(ctx context.Context, db DBTX, limit int) ([]DeadMessage, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list dead outbox rows: limit %d must be positive", limit)
	}
	rows, err := db.Query(ctx, s.sql.listDead, limit)
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

// requeueDead gives dead rows a fresh set of attempts. last_error stays for the record. It
// wakes the relays on $2, the table's notify channel.
const requeueDead = `
WITH requeued AS (
  UPDATE {{.Messages}}
  SET dead_at = NULL, attempts = 0, next_attempt_at = now(), waiting = false
  WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL
  RETURNING 1
)
SELECT count(*), pg_notify($2, '') FROM requeued`

// Requeue makes the given dead rows pending again with a fresh set of attempts, and returns
// how many it requeued; ids that are not dead are ignored. A requeued row is published after
// the rows of its aggregate written after it (README.md#ordering).
func Requeue(ctx context.Context, db DBTX, ids ...uuid.UUID) (int64, error) {
	return defaultStore.Requeue(ctx, db, ids...)
}

// Requeue is [Requeue] for the store's table; it wakes the relays of that table.
func (s *Store) Requeue(ctx context.Context, db DBTX, ids ...uuid.UUID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	arr := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		arr[i] = pgUUID(id)
	}
	var n int64
	var notified any
	if err := db.QueryRow(ctx, s.sql.requeueDead, arr, s.channel).Scan(&n, &notified); err != nil {
		return 0, fmt.Errorf("requeue dead outbox rows: %w", err)
	}
	return n, nil
}

package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DBTX is the narrow part of a database handle the outbox needs. pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it. [Add] is meant to be given the caller's pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertMessage inserts one row, the common case: one event per business transaction. It and
// the other statements are templates, rendered once per [Store] with its table names
// ({{.Messages}}: the quoted, schema-qualified outbox table).
const insertMessage = `
INSERT INTO {{.Messages}} (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
VALUES ($1::uuid, $2, $3, $4, $5, $6, $7::text::json, $8::text::jsonb)`

// insertMessages inserts any number of rows in one round trip. For one row, insertMessage is
// cheaper: with the deferred notify trigger, an INSERT … SELECT FROM unnest measured about a
// third fewer transactions per second than the same row inserted with VALUES, at 16 writers.
const insertMessages = `
INSERT INTO {{.Messages}} (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]::json[], $8::text[]::jsonb[])`

// ErrInvalidMessage is wrapped by the errors of [Message.Validate], and so of [Add], [AddSQL]
// and [QueueAdd] for a message they refuse.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// Add writes msgs to the outbox inside tx, the caller's transaction: they become visible to
// the relay when, and only when, tx commits. Add never begins or commits a transaction.
//
// Add fills in msgs[i].ID when it is zero. It checks every message with [Message.Validate]
// before writing any: for the first that fails it returns an error wrapping
// [ErrInvalidMessage], naming the message and the field, writes nothing, and leaves tx
// usable.
//
// Add records the trace context of ctx in each row's headers, through the global
// OpenTelemetry propagator, unless the message sets those headers itself
// (README.md#tracing); msgs[i].Headers is not changed.
func Add(ctx context.Context, tx DBTX, msgs ...Message) error {
	return defaultStore.Add(ctx, tx, msgs...)
}

// AddSQL is [Add] for a database/sql transaction (pgx's stdlib driver, say): the same
// checks, the same trace context, the same rows, written by the same statements.
func AddSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	return defaultStore.AddSQL(ctx, tx, msgs...)
}

// Add is [Add] for the store's table. It records the trace context through the store's
// propagator ([Store.WithPropagator]), by default the global one.
func (s *Store) Add(ctx context.Context, tx DBTX, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c, err := s.columns(ctx, msgs)
	if err != nil {
		return err
	}
	query, args := s.insert(c)
	if _, err := tx.Exec(ctx, query, args...); err != nil {
		if len(msgs) == 1 {
			return fmt.Errorf("insert outbox message: %w", err)
		}
		return fmt.Errorf("insert %d outbox messages: %w", len(msgs), err)
	}
	return nil
}

// QueueAdd is [Add] for a caller that sends several statements in one round trip: it queues
// on b the one statement that Add would run for msgs, and the messages are written when b is
// sent on the caller's transaction (tx.SendBatch), in their place among b's statements. Like
// Add's, the rows become visible to the relay when, and only when, that transaction commits.
//
// QueueAdd checks msgs, fills in their ids and records the trace context of ctx as Add does,
// before it queues anything: for a message it refuses it returns an error wrapping
// [ErrInvalidMessage] and leaves b as it was. Otherwise it queues exactly one statement (none
// for no message), whose result the caller reads among b's results in its place, like any
// other's: an error there means the messages were not written.
func QueueAdd(ctx context.Context, b *pgx.Batch, msgs ...Message) error {
	return defaultStore.QueueAdd(ctx, b, msgs...)
}

// QueueAdd is [QueueAdd] for the store's table, with the store's propagator.
func (s *Store) QueueAdd(ctx context.Context, b *pgx.Batch, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c, err := s.columns(ctx, msgs)
	if err != nil {
		return err
	}
	query, args := s.insert(c)
	b.Queue(query, args...)
	return nil
}

// insert returns the statement that writes the rows of c, and its arguments: insertMessage
// for one row, insertMessages for several.
func (s *Store) insert(c columns) (query string, args []any) {
	if len(c.ids) == 1 {
		return s.sql.insertMessage, []any{c.ids[0], c.exchanges[0], c.keys[0], c.types[0], c.aggTypes[0], c.aggIDs[0], c.payloads[0], c.headers[0]}
	}
	return s.sql.insertMessages, []any{c.ids, c.exchanges, c.keys, c.types, c.aggTypes, c.aggIDs, c.payloads, c.headers}
}

// AddSQL is [AddSQL] for the store's table, with the store's propagator.
func (s *Store) AddSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c, err := s.columns(ctx, msgs)
	if err != nil {
		return err
	}
	// Several messages take one statement, as with Add, their columns bound as PostgreSQL
	// array literals (textArray), which every driver sends as text.
	ids := make([]string, len(msgs))
	for i, id := range c.ids {
		ids[i] = uuid.UUID(id.Bytes).String()
	}
	if len(msgs) == 1 {
		if _, err := tx.ExecContext(ctx, s.sql.insertMessage, ids[0], c.exchanges[0], c.keys[0], c.types[0], c.aggTypes[0], c.aggIDs[0], c.payloads[0], c.headers[0]); err != nil {
			return fmt.Errorf("insert outbox message: %w", err)
		}
		return nil
	}
	if _, err := tx.ExecContext(ctx, s.sql.insertMessages, textArray(ids), textArray(c.exchanges), textArray(c.keys), textArray(c.types),
		textArray(c.aggTypes), textArray(c.aggIDs), textArray(c.payloads), textArray(c.headers)); err != nil {
		return fmt.Errorf("insert %d outbox messages: %w", len(msgs), err)
	}
	return nil
}

// columns are the values of the rows Add writes, one slice per column, in the order of the
// messages: the arguments of insertMessage and insertMessages.
type columns struct {
	ids                                 []pgtype.UUID
	exchanges, keys, types              []string
	aggTypes, aggIDs, payloads, headers []string
}

// columns checks msgs, fills in their missing ids and returns their rows' values, with the
// trace context of ctx recorded in their headers.
func (s *Store) columns(ctx context.Context, msgs []Message) (columns, error) {
	n := len(msgs)
	c := columns{
		ids:       make([]pgtype.UUID, n),
		exchanges: make([]string, n), keys: make([]string, n), types: make([]string, n),
		aggTypes: make([]string, n), aggIDs: make([]string, n),
		payloads: make([]string, n), headers: make([]string, n),
	}
	for i := range msgs {
		m := &msgs[i]
		// The caller's trace context goes into the row now, when the message is written,
		// not when it is relayed: the relay runs later, on contexts of its own.
		hdrs := traceHeaders(ctx, s.propagator, m.Headers)
		stored := *m
		stored.Headers = hdrs
		if err := stored.Validate(); err != nil {
			return columns{}, fmt.Errorf("add outbox message %d: %w", i, err)
		}
		if m.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return columns{}, fmt.Errorf("add outbox message: new id: %w", err)
			}
			m.ID = id
		}
		h, err := json.Marshal(hdrs)
		if err != nil {
			return columns{}, fmt.Errorf("add outbox message %s: encode headers: %w", m.ID, err)
		}
		if hdrs == nil {
			h = []byte("{}")
		}
		c.ids[i] = pgUUID(m.ID)
		c.exchanges[i], c.keys[i], c.types[i] = m.Exchange, m.RoutingKey, m.Type
		c.aggTypes[i], c.aggIDs[i] = m.AggregateType, m.AggregateID
		c.payloads[i], c.headers[i] = string(m.Payload), string(h)
	}
	return c, nil
}

// textArray is ss as a PostgreSQL array literal, every element quoted, so that the server
// reads each back as it was: inside double quotes only '"' and '\' need a backslash (ASCII
// bytes, never part of a multi-byte UTF-8 sequence), and white space is kept.
func textArray(ss []string) string {
	size := 2
	for _, s := range ss {
		size += len(s) + 3
	}
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, s[j])
		}
		b = append(b, '"')
	}
	return string(append(b, '}'))
}

// pgUUID is id as pgx encodes it without looking further: the 16 bytes in PostgreSQL's
// binary form. Ids go to the database as this, never as strings: pgx sends a []string bound
// to a uuid[] parameter in binary first, fails and builds an error for it (formatting every
// element), then sends it as text: for a batch of 100 ids, about eight times the CPU and
// five times the allocations (BenchmarkIDParameter).
func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

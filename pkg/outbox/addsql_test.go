package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// sqlDB is the bundle's database through database/sql and pgx's stdlib driver.
func (b *bundle) sqlDB(t *testing.T) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(b.pool)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// addSQL runs outbox.AddSQL in a database/sql transaction that it commits unless AddSQL
// failed.
func addSQL(ctx context.Context, db *sql.DB, msgs ...outbox.Message) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := outbox.AddSQL(ctx, tx, msgs...); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// awkward returns messages whose text a careless encoding would change: quotes, backslashes,
// braces and commas (the array literal's own syntax), white space, key order, duplicate
// keys, the \u0000 escape, and text beyond ASCII.
func awkward(b *bundle, aggregate string) []outbox.Message {
	payloads := []string{
		`{"b": 1,   "a": "x\"y\\z",  "a": "dup"}`,
		"{\n\t\"note\": \"{braces}, \\\"commas\\\", and \\u0000\"\n}",
		`[1, 2.50, "é😀", null, {"k": "\\\\"}]`,
		`"a lone string, with a comma"`,
	}
	msgs := make([]outbox.Message, len(payloads))
	for i, p := range payloads {
		m := b.msg(aggregate, i)
		m.Payload = json.RawMessage(p)
		m.Headers = map[string]string{outbox.HeaderCorrelationID: `c"o,r{r}\`, "note": "tab\there, é"}
		msgs[i] = m
	}
	return msgs
}

// requireSameRows checks that the rows of got, written by another path than Add, hold what
// the rows of want, written by Add before them, hold, and come after them in the table's
// order, so that they are published after them in the same aggregate.
func (b *bundle) requireSameRows(t *testing.T, want, got []outbox.Message) {
	t.Helper()
	ctx := context.Background()
	const row = `SELECT exchange, routing_key, type, aggregate_type, aggregate_id, payload::text, headers, attempts,
		published_at IS NULL AND dead_at IS NULL FROM outbox_messages WHERE id = $1`
	read := func(id uuid.UUID) []any {
		var ex, key, typ, aggType, aggID, payload string
		var headers map[string]string
		var attempts int
		var pending bool
		require.NoError(t, b.pool.QueryRow(ctx, row, id).Scan(&ex, &key, &typ, &aggType, &aggID, &payload, &headers, &attempts, &pending))
		return []any{ex, key, typ, aggType, aggID, payload, headers, attempts, pending}
	}
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, read(want[i].ID), read(got[i].ID))
	}
	var wantSeq, gotSeq int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT max(seq) FROM outbox_messages WHERE id = ANY($1)", ids(want)).Scan(&wantSeq))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT min(seq) FROM outbox_messages WHERE id = ANY($1)", ids(got)).Scan(&gotSeq))
	require.Less(t, wantSeq, gotSeq, "written after, so published after, in the same aggregate")
}

// TestAddSQL: a message added through database/sql is stored and published exactly like one
// added through pgx, and a bad one is refused the same way.
func TestAddSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PublishedLikeAdd", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := b.sqlDB(t)
		got := consume(t, b.amqpURL, b.top.Queue)
		viaPgx := b.write(t, awkward(b, "pgx")...)
		viaSQL := awkward(b, "sql")
		require.NoError(t, addSQL(ctx, db, viaSQL...))
		for _, m := range viaSQL {
			require.NotEqual(t, uuid.Nil, m.ID, "AddSQL fills in the id, as Add does")
		}
		one := b.msg("sql-one", 1)
		one.Payload = json.RawMessage(`{ "single" : "row, \"VALUES\"" }`)
		oneSQL := []outbox.Message{one}
		require.NoError(t, addSQL(ctx, db, oneSQL...))

		b.startRelay(t, b.pool, b.pub, fastConfig(t))
		want := len(viaPgx) + len(viaSQL) + 1
		testinfra.Eventually(t, waitFor, func() bool { return got.len() >= want }, "every message published")
		byID := map[string]amqp.Delivery{}
		for _, d := range got.all() {
			byID[d.MessageId] = d
		}
		require.Len(t, byID, want)
		published := func(m outbox.Message) amqp.Delivery {
			d, ok := byID[m.ID.String()]
			require.True(t, ok, "message %s published", m.ID)
			return d
		}
		for i := range viaPgx {
			p, s := published(viaPgx[i]), published(viaSQL[i])
			require.Equal(t, string(viaSQL[i].Payload), string(s.Body), "the payload byte for byte")
			require.Equal(t, string(p.Body), string(s.Body))
			require.Equal(t, p.Type, s.Type)
			require.Equal(t, p.CorrelationId, s.CorrelationId)
			require.Equal(t, p.ContentType, s.ContentType)
			require.Equal(t, p.RoutingKey, s.RoutingKey)
			for _, h := range []string{outbox.HeaderAggregateID, outbox.HeaderTraceparent, outbox.HeaderTracestate} {
				delete(p.Headers, h) // the aggregates differ, and so would the publish spans
				delete(s.Headers, h)
			}
			require.Equal(t, p.Headers, s.Headers)
		}
		require.Equal(t, string(one.Payload), string(published(oneSQL[0]).Body))
	})

	t.Run("RowsLikeAdd", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := b.sqlDB(t)
		viaPgx := b.write(t, awkward(b, "agg")...)
		viaSQL := awkward(b, "agg")
		require.NoError(t, addSQL(ctx, db, viaSQL...))
		b.requireSameRows(t, viaPgx, viaSQL)
	})

	t.Run("RefusesLikeAdd", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := b.sqlDB(t)
		good := b.msg("a", 1)
		for name, mutate := range map[string]func(*outbox.Message){
			"NoType":         func(m *outbox.Message) { m.Type = "" },
			"NoDestination":  func(m *outbox.Message) { m.Exchange, m.RoutingKey = "", "" },
			"PayloadNotJSON": func(m *outbox.Message) { m.Payload = json.RawMessage(`{"unterminated"`) },
			"NULInHeader":    func(m *outbox.Message) { m.Headers = map[string]string{"h": "a\x00"} },
			"ReservedHeader": func(m *outbox.Message) { m.Headers = map[string]string{outbox.HeaderAggregateID: "x"} },
		} {
			t.Run(name, func(t *testing.T) {
				bad := b.msg("a", 2)
				mutate(&bad)
				pgxErr := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, good, bad) })
				require.ErrorIs(t, pgxErr, outbox.ErrInvalidMessage)

				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }()
				sqlErr := outbox.AddSQL(ctx, tx, good, bad)
				require.ErrorIs(t, sqlErr, outbox.ErrInvalidMessage)
				require.Equal(t, pgxErr.Error(), sqlErr.Error())
				var one int
				require.NoError(t, tx.QueryRowContext(ctx, "SELECT 1").Scan(&one), "the transaction is left usable")
			})
		}
		require.Zero(t, b.count(t, "true"), "nothing written")
	})

	t.Run("RolledBackTransactionLeavesNoRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tx, err := b.sqlDB(t).BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, outbox.AddSQL(ctx, tx, b.msg("a", 1), b.msg("a", 2)))
		require.NoError(t, tx.Rollback())
		require.Zero(t, b.count(t, "true"))
	})

	t.Run("StoreTables", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		store, err := outbox.NewStore(outbox.Tables{Schema: "sql path", Messages: "events"})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx, b.pool))
		tx, err := b.sqlDB(t).BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, store.AddSQL(ctx, tx, b.msg("a", 1), b.msg("b", 1)))
		require.NoError(t, store.AddSQL(ctx, tx, b.msg("c", 1)))
		require.NoError(t, tx.Commit())
		st, err := store.ReadStats(ctx, b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 3, st.Pending)
		require.WithinDuration(t, time.Now(), st.OldestPending, time.Minute)
		require.Zero(t, b.count(t, "true"), "not the default table")
	})
}

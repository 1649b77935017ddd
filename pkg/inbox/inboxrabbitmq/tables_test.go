package inboxrabbitmq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestNewConsumerRefusesInvalidTables(t *testing.T) {
	t.Parallel()
	var pool *pgxpool.Pool // never used: NewConsumer does not connect
	_, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "orders", Name: "orders-projection",
		Handler: recordEffect, DeadLetterExchange: "dead",
		Tables: inbox.Tables{Messages: strings.Repeat("m", inbox.MaxTableBytes+1)},
	})
	require.ErrorIs(t, err, inbox.ErrInvalidTables)
}

// TestConsumerTables runs two consumers of one name into one database, one with the default
// tables and one with a table of its own in schema billing (outside search_path): each
// records and deduplicates the same message in its own table.
func TestConsumerTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t) // the default tables
	ledgerTables := inbox.Tables{Schema: "billing", Messages: "ledger_inbox"}
	s, err := inbox.NewStore(ledgerTables)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx, b.pool))
	ledgerTop := testinfra.DeclareTopology(t, b.amqpURL)

	handler := func(table string) inboxrabbitmq.Handler {
		return func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, d.ID, table)
			return err
		}
	}
	b.run(t, b.config(handler("default")))
	ledger := b.config(handler("ledger"))
	ledger.Queue = ledgerTop.Queue
	ledger.Tables = ledgerTables
	b.run(t, ledger)

	effects := func(table string) int {
		return countRows(t, b.pool, `SELECT count(*) FROM effects WHERE message_id = 'm-1' AND body = $1`, table)
	}
	for round := 1; round <= 2; round++ { // the second round is a redelivery of the same message
		b.publish(t, jsonMessage("m-1"))
		b.publishTo(t, ledgerTop.Exchange, routingKey, jsonMessage("m-1"))
		testinfra.Eventually(t, 20*time.Second, func() bool {
			processed, duplicates := b.events.counts()
			return processed+duplicates == 2*round
		}, "round %d handled", round)
		processed, duplicates := b.events.counts()
		require.Equal(t, 2, processed, "once per table")
		require.Equal(t, 2*(round-1), duplicates)
	}
	require.Equal(t, 1, effects("default"))
	require.Equal(t, 1, effects("ledger"))
	require.Equal(t, 1, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
	require.Equal(t, 1, countRows(t, b.pool, `SELECT count(*) FROM billing.ledger_inbox`))
}

// countRows runs a count query.
func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

package inboxrabbitmq_test

import (
	"context"
	"fmt"
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

// TestConsumerPartitioned runs a consumer on a partitioned inbox (hourly partitions) while a
// cleaner makes partitions and drops an old one, again and again: every message, published
// twice, is applied once; a copy of a message processed in an earlier partition is a
// duplicate; and a copy of one whose partition was dropped with its retention is applied
// again, as the retention says.
func TestConsumerPartitioned(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	tables := inbox.Tables{Messages: "hourly_inbox", Partition: time.Hour}
	store, err := inbox.NewStore(tables)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, b.pool))
	cfg := b.config(recordEffect)
	cfg.Tables = tables

	// Two messages processed before, three days and 20 hours ago, each in its own partition.
	var now time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT now()`).Scan(&now))
	for id, age := range map[string]time.Duration{"m-old": 72 * time.Hour, "m-recent": 20 * time.Hour} {
		lo := now.Add(-age).Truncate(time.Hour)
		_, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE "hourly_inbox_p%s" PARTITION OF hourly_inbox FOR VALUES FROM ('%s') TO ('%s')`,
			lo.UTC().Format("200601021504"), lo.UTC().Format(time.RFC3339), lo.Add(time.Hour).UTC().Format(time.RFC3339)))
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `INSERT INTO hourly_inbox (consumer, message_id, message_type, received_at, processed_at)
VALUES ($1, $2, 'order.placed', $3, $3)`, cfg.Name, id, now.Add(-age))
		require.NoError(t, err)
	}

	b.run(t, cfg)
	cleanerCtx, stopCleaner := context.WithCancel(ctx)
	cleaned := make(chan error, 1)
	go func() {
		defer close(cleaned)
		// A run every 50ms, as RunCleanup would at a (very) short interval.
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := store.Cleanup(cleanerCtx, b.pool, inbox.CleanupConfig{Retention: 24 * time.Hour, PartitionsAhead: 6 * time.Hour}); err != nil {
				if cleanerCtx.Err() == nil {
					cleaned <- err
				}
				return
			}
			select {
			case <-cleanerCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	const n = 100
	for i := range 2 * n {
		b.publish(t, jsonMessage(fmt.Sprintf("m-%d", i%n)))
	}
	b.publish(t, jsonMessage("m-recent"))
	testinfra.Eventually(t, 60*time.Second, func() bool {
		processed, duplicates := b.events.counts()
		return processed+duplicates == 2*n+1
	}, "every delivery handled")
	stopCleaner()
	for err := range cleaned {
		require.NoError(t, err)
	}
	processed, duplicates := b.events.counts()
	require.Equal(t, n, processed)
	require.Equal(t, n+1, duplicates)
	require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM (SELECT message_id FROM effects GROUP BY 1 HAVING count(*) > 1) d`))
	require.Zero(t, b.effects(t, "m-recent"), "processed 20 hours ago: a duplicate")
	require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM hourly_inbox WHERE message_id = 'm-old'`), "its partition dropped")

	b.publish(t, jsonMessage("m-old"))
	testinfra.Eventually(t, 20*time.Second, func() bool { return b.effects(t, "m-old") == 1 },
		"a copy after its retention is applied again")
}

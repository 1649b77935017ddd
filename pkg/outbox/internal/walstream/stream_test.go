package walstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/walstream"
)

func msg(agg string, n int) outbox.Message {
	return outbox.Message{Exchange: "x", RoutingKey: "k", Type: "T", AggregateType: "a", AggregateID: agg,
		Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
}

func ids[M outbox.Message | walstream.Row](msgs []M) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = outbox.Message(m).ID.String()
	}
	return out
}

// TestStream reads a slot on a private primary at wal_level=logical. One pair serves the
// subtests, each in a database, slot and publication of its own.
func TestStream(t *testing.T) {
	t.Parallel()
	pair := testinfra.StartLogicalPostgresPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// setup makes database db with the outbox migrated, a publication of its table and the
	// stream's config; the slot is made by the first Open.
	setup := func(t *testing.T, db string) (*pgxpool.Pool, walstream.Config) {
		t.Helper()
		pair.CreateDatabase(t, db)
		url := pair.Primary.URL(db)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		require.NoError(t, outbox.Migrate(ctx, pool))
		_, err = pool.Exec(ctx, "CREATE PUBLICATION outbox FOR TABLE outbox_messages WITH (publish = 'insert')")
		require.NoError(t, err)
		t.Cleanup(func() { // a slot keeps its database from being dropped
			_, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()")
		})
		return pool, walstream.Config{URL: url, Slot: "slot_" + db, Publication: "outbox", Table: "outbox_messages"}
	}
	open := func(t *testing.T, cfg walstream.Config) *walstream.Stream {
		t.Helper()
		s, err := walstream.Open(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	write := func(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []outbox.Message {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, msgs...) }))
		return msgs
	}

	t.Run("InCommitOrder", func(t *testing.T) {
		pool, cfg := setup(t, "commit_order")
		s := open(t, cfg)
		// Two transactions, the one begun first committed last; one between them writes no
		// outbox row.
		tx1, err := pool.Begin(ctx)
		require.NoError(t, err)
		first := []outbox.Message{msg("a", 1), msg("b", 1)}
		require.NoError(t, outbox.Add(ctx, tx1, first...))
		second := write(t, pool, msg("a", 2))
		_, err = pool.Exec(ctx, "CREATE TABLE other (x int); INSERT INTO other VALUES (1)")
		require.NoError(t, err)
		require.NoError(t, tx1.Commit(ctx))

		c1, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(second), ids(c1.Messages))
		c2, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(first), ids(c2.Messages), "the rows of a transaction in the order inserted")
		require.Greater(t, c2.End, c1.End)
		require.Len(t, c2.Seqs, 2)
		require.Less(t, c2.Seqs[0], c1.Seqs[0], "seq is write order; the stream is commit order")
	})

	t.Run("RowsAsWritten", func(t *testing.T) {
		pool, cfg := setup(t, "rows")
		s := open(t, cfg)
		payloads := []string{
			`{"b": 1,   "a": "x\"y\\z",  "a": "dup"}`,
			"{\n\t\"note\": \"{braces}, \\\"commas\\\", and \\u0000\"\n}",
			`[1, 2.50, "é😀", null, {"k": "\\\\"}]`,
		}
		var want []outbox.Message
		for i, p := range payloads {
			m := msg("agg", i)
			m.Payload = json.RawMessage(p)
			m.Headers = map[string]string{outbox.HeaderCorrelationID: `c"o,r{r}\`, "note": "tab\there, é"}
			want = append(want, m)
		}
		write(t, pool, want...)
		c, err := s.Next(ctx)
		require.NoError(t, err)
		require.Len(t, c.Messages, len(want))
		for i, got := range c.Messages {
			require.Equal(t, want[i].ID, got.ID)
			require.Equal(t, string(want[i].Payload), string(got.Payload), "the payload byte for byte")
			require.Equal(t, want[i].Headers, got.Headers)
			for _, f := range [][2]string{{want[i].Exchange, got.Exchange}, {want[i].RoutingKey, got.RoutingKey}, {want[i].Type, got.Type},
				{want[i].AggregateType, got.AggregateType}, {want[i].AggregateID, got.AggregateID}} {
				require.Equal(t, f[0], f[1])
			}
			var created time.Time
			require.NoError(t, pool.QueryRow(ctx, "SELECT created_at FROM outbox_messages WHERE id = $1", got.ID).Scan(&created))
			require.True(t, created.Equal(got.CreatedAt), "created_at %s, read %s", created, got.CreatedAt)
			require.Zero(t, got.Attempts)
		}
	})

	// A stream that stops starts again after the last commit it confirmed: the commits after
	// it are read again, nothing before it.
	t.Run("RestartsAfterTheConfirmed", func(t *testing.T) {
		pool, cfg := setup(t, "restart")
		s := open(t, cfg)
		one := write(t, pool, msg("a", 1))
		two := write(t, pool, msg("a", 2))
		c1, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(one), ids(c1.Messages))
		c2, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(two), ids(c2.Messages))
		require.NoError(t, s.Confirm(ctx, c1.End))
		require.NoError(t, s.Close(ctx))

		s = open(t, cfg)
		again, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(two), ids(again.Messages), "the unconfirmed commit again")
		three := write(t, pool, msg("a", 3))
		c3, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(three), ids(c3.Messages))
	})

	// A stream that stops reading while the server still sends (its caller stopped) tells
	// the server its last position on Close all the same. Closing a socket with unread data
	// resets the connection, and a reset can reach the server before it read the status
	// sent just before: a restart then read again what had been confirmed.
	t.Run("ClosesWithItsLastStatus", func(t *testing.T) {
		pool, cfg := setup(t, "last_status")
		for round := range 10 {
			s, err := walstream.Open(ctx, cfg)
			require.NoError(t, err)
			write(t, pool, msg("a", round))
			c, err := s.Next(ctx)
			require.NoError(t, err)
			// Commits the stream never reads: the server sends them into the socket.
			big := msg("b", round)
			big.Payload = json.RawMessage(fmt.Sprintf(`{"pad": %q}`, strings.Repeat("x", 8<<10)))
			for range 64 {
				write(t, pool, big)
			}
			var end pglogrepl.LSN
			require.NoError(t, pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&end))
			testinfra.Eventually(t, 10*time.Second, func() bool {
				var sent pglogrepl.LSN
				err := pool.QueryRow(ctx, `SELECT r.sent_lsn FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
					WHERE s.slot_name = $1`, cfg.Slot).Scan(&sent)
				return err == nil && sent >= c.End+1
			}, "the server sends past the commit read")
			s.Advance(c.End)
			require.NoError(t, s.Close(ctx))
			// Whether the slot is free at once, then (once it is) whether the server read the
			// status: the position is the loss, so it is checked first.
			var activeAtOnce, active bool
			var confirmed pglogrepl.LSN
			require.NoError(t, pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot).Scan(&activeAtOnce))
			testinfra.Eventually(t, 10*time.Second, func() bool {
				err := pool.QueryRow(ctx, "SELECT active, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot).Scan(&active, &confirmed)
				return err == nil && !active
			}, "the walsender gone")
			require.GreaterOrEqual(t, confirmed, c.End, "round %d: the last status reached the server", round)
			require.False(t, activeAtOnce, "round %d: the replication ended with Close: the slot is free at once", round)
		}
	})

	// An idle stream answers the server's keepalives: past wal_sender_timeout it still reads.
	t.Run("IdlePastTheSenderTimeout", func(t *testing.T) {
		pool, cfg := setup(t, "idle")
		_, err := pool.Exec(ctx, "ALTER DATABASE idle SET wal_sender_timeout = '1s'")
		require.NoError(t, err)
		cfg.StatusInterval = 200 * time.Millisecond
		s := open(t, cfg)
		var timeout string
		require.NoError(t, pool.QueryRow(ctx, "SHOW wal_sender_timeout").Scan(&timeout))
		idle, cancelIdle := context.WithTimeout(ctx, 3*time.Second)
		_, err = s.Next(idle)
		cancelIdle()
		require.ErrorIs(t, err, context.DeadlineExceeded, "nothing to read")
		later := write(t, pool, msg("a", 1))
		c, err := s.Next(ctx)
		require.NoError(t, err, "the stream survived %s of idleness (wal_sender_timeout %s)", 3*time.Second, timeout)
		require.Equal(t, ids(later), ids(c.Messages))
	})

	// A quiet server answers every status; a silent one (cut off by the network: nothing
	// resets the connection) is given up on after SilenceTimeout.
	t.Run("GivesUpOnASilentServer", func(t *testing.T) {
		_, cfg := setup(t, "silent")
		u, err := url.Parse(cfg.URL)
		require.NoError(t, err)
		proxy := testinfra.NewProxy(t, u.Host)
		cfg.URL = proxy.RewriteURL(t, cfg.URL)
		cfg.StatusInterval, cfg.SilenceTimeout = 100*time.Millisecond, time.Second
		s := open(t, cfg)
		idle, cancelIdle := context.WithTimeout(ctx, 3*time.Second)
		_, err = s.Next(idle)
		cancelIdle()
		require.ErrorIs(t, err, context.DeadlineExceeded, "idle for three silence timeouts, the server answering")

		proxy.Freeze()
		t.Cleanup(proxy.Resume)
		start := time.Now()
		_, err = s.Next(ctx)
		require.ErrorIs(t, err, walstream.ErrSilent)
		require.Less(t, time.Since(start), 3*time.Second, "given up on within the silence timeout, and a status interval")
		// Its Close does not wait for an answer that will not come (ctx allows two minutes).
		start = time.Now()
		_ = s.Close(ctx)
		require.Less(t, time.Since(start), 3*time.Second, "a failed stream closed at once")
	})

	t.Run("OnlyTheConfiguredTable", func(t *testing.T) {
		pool, cfg := setup(t, "tables")
		store, err := outbox.NewStore(outbox.Tables{Schema: "wal path", Messages: "events"})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx, pool))
		_, err = pool.Exec(ctx, `CREATE TABLE public.events (LIKE "wal path".events INCLUDING ALL);
			ALTER PUBLICATION outbox ADD TABLE "wal path".events, public.events`)
		require.NoError(t, err)
		cfg.Schema, cfg.Table = "wal path", "events"
		s := open(t, cfg)
		write(t, pool, msg("default table", 1))
		_, err = pool.Exec(ctx, `INSERT INTO public.events (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload)
			VALUES (gen_random_uuid(), 'x', 'k', 'T', 'a', 'another schema', '{}')`)
		require.NoError(t, err)
		want := []outbox.Message{msg("named", 1)}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return store.Add(ctx, tx, want...) }))
		c, err := s.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, ids(want), ids(c.Messages))
	})
}

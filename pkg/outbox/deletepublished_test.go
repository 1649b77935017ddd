package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// TestDeletePublished runs two polling relays with Config.DeletePublished over one table:
// spread rows, one hot aggregate and a poison row. Every healthy row is delivered, the hot
// aggregate's in order, and the table is left with the dead row alone; ReadStats, ListDead,
// Requeue and Cleanup mean what they mean when published rows are kept.
func TestDeletePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	got := consume(t, b.amqpURL, b.top.Queue)
	cfg := fastConfig(t)
	cfg.DeletePublished = true
	cfg.BatchSize = 10
	cfg.MaxMessageBytes = 1 << 10
	var mu sync.Mutex
	var published int
	cfg.Hooks.BatchDone = func(r outbox.BatchResult) {
		mu.Lock()
		published += len(r.Published)
		mu.Unlock()
	}
	b.startRelay(t, b.pool, b.pub, cfg)
	b.startRelay(t, b.pool, b.pub, cfg)

	big := b.msg("big", 0)
	big.Payload = json.RawMessage(`{"p":"` + strings.Repeat("x", 2<<10) + `"}`)
	bigID := b.write(t, big)[0].ID
	var hot []string
	for n := range 200 {
		msgs := []outbox.Message{b.msg("hot", n), b.msg(fmt.Sprintf("spread-%d", n), n)}
		b.write(t, msgs...)
		hot = append(hot, msgs[0].ID.String())
	}
	testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 400 }, "every healthy row delivered")
	var order []string
	seen := map[string]bool{}
	for _, d := range got.all() {
		if d.Headers["aggregate_id"] == "hot" && !seen[d.MessageId] {
			seen[d.MessageId] = true
			order = append(order, d.MessageId)
		}
	}
	require.Equal(t, hot, order, "the hot aggregate's rows in order")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "true") == 1 }, "the published rows deleted, the dead row kept")
	require.Equal(t, 1, b.count(t, fmt.Sprintf("id = '%s' AND dead_at IS NOT NULL", bigID)))
	mu.Lock()
	require.Equal(t, 400, published, "every delete counted as published, once")
	mu.Unlock()

	st, err := outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Dead: 1}, st)
	dead, err := outbox.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, bigID, dead[0].ID)
	deleted, err := outbox.Cleanup(ctx, b.pool, outbox.CleanupConfig{Retention: 1})
	require.NoError(t, err)
	require.Zero(t, deleted, "nothing for the cleanup")

	// The poison fixed by hand and requeued: published, then deleted like the others.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_messages SET payload = '{"p":"fixed"}' WHERE id = $1`, bigID)
	require.NoError(t, err)
	n, err := outbox.Requeue(ctx, b.pool, bigID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testinfra.Eventually(t, waitFor, func() bool { return got.ids()[bigID.String()] == 1 }, "the requeued row delivered")
	testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "true") == 0 }, "and deleted")
}

// TestDeletePublishedCannotDelete: a relay with DeletePublished whose role may not delete
// from the table publishes nothing, and says why; one whose DELETE a trigger turns away
// fails its batches, saying why, until the trigger is gone. Neither loses a row.
func TestDeletePublishedCannotDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	got := consume(t, b.amqpURL, b.top.Queue)
	errs := make(chan error, 100)
	cfg := fastConfig(t)
	cfg.DeletePublished = true
	cfg.DisableNotify = true
	cfg.Hooks.StateChanged = func(c outbox.StateChange) {
		if c.Err != nil {
			select {
			case errs <- c.Err:
			default:
			}
		}
	}
	waitErr := func(want string) {
		t.Helper()
		timeout := time.After(waitFor)
		for {
			select {
			case err := <-errs:
				if strings.Contains(err.Error(), want) {
					return
				}
			case <-timeout:
				t.Fatalf("no relay error saying %q", want)
			}
		}
	}

	t.Run("NoDeletePrivilege", func(t *testing.T) {
		role := fmt.Sprintf("nodelete_%d", time.Now().UnixNano())
		for _, q := range []string{
			"CREATE ROLE " + role + " LOGIN",
			"GRANT SELECT, UPDATE ON outbox_messages TO " + role,
		} {
			_, err := b.pool.Exec(ctx, q)
			require.NoError(t, err, q)
		}
		t.Cleanup(func() {
			_, _ = b.pool.Exec(ctx, "DROP OWNED BY "+role)
			_, _ = b.pool.Exec(ctx, "DROP ROLE "+role)
		})
		pool, err := pgxpool.New(ctx, strings.Replace(b.pool.Config().ConnString(), "postgres@", role+"@", 1))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		id := b.write(t, b.msg("no-privilege", 0))[0].ID
		b.startRelay(t, pool, b.pub, cfg)
		waitErr("GRANT DELETE ON")
		require.Zero(t, got.len(), "nothing published by a relay that could not delete it")
		_, err = b.pool.Exec(ctx, "GRANT DELETE ON outbox_messages TO "+role)
		require.NoError(t, err)
		testinfra.Eventually(t, waitFor, func() bool { return got.ids()[id.String()] >= 1 }, "published once it may delete")
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "true") == 0 }, "and deleted")
	})

	t.Run("ATriggerKeepsTheRows", func(t *testing.T) {
		_, err := b.pool.Exec(ctx, `
CREATE FUNCTION keep_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER keep_rows BEFORE DELETE ON outbox_messages FOR EACH ROW EXECUTE FUNCTION keep_rows();`)
		require.NoError(t, err)
		id := b.write(t, b.msg("kept", 0))[0].ID
		b.startRelay(t, b.pool, b.pub, cfg)
		waitErr("not deleted: a trigger, a rule or a row security policy")
		require.Equal(t, 1, b.count(t, "published_at IS NULL AND dead_at IS NULL AND attempts = 0"),
			"the row is pending, and no attempt of it counted: the database failed, not the message")
		_, err = b.pool.Exec(ctx, "DROP TRIGGER keep_rows ON outbox_messages")
		require.NoError(t, err)
		testinfra.Eventually(t, waitFor, func() bool { return b.count(t, "true") == 0 }, "deleted once the trigger is gone")
		require.GreaterOrEqual(t, got.ids()[id.String()], 1)
	})
}

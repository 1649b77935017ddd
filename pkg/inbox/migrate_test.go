package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("CreatesTheSchema", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := testinfra.NewPool(t)
		require.NoError(t, inbox.Migrate(ctx, pool))

		rows, err := pool.Query(ctx, `SELECT column_name || ' ' || data_type || ' ' || is_nullable
			FROM information_schema.columns WHERE table_name = 'inbox_messages' ORDER BY ordinal_position`)
		require.NoError(t, err)
		var columns []string
		for rows.Next() {
			var c string
			require.NoError(t, rows.Scan(&c))
			columns = append(columns, c)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{
			"consumer text NO",
			"message_id text NO",
			"message_type text NO",
			"received_at timestamp with time zone NO",
			"processed_at timestamp with time zone NO",
		}, columns)

		var pkey, index string
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_indexdef('inbox_messages_pkey'::regclass)`).Scan(&pkey))
		require.Contains(t, pkey, "(consumer, message_id)")
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_indexdef('inbox_messages_processed_at_idx'::regclass)`).Scan(&index))
		require.Contains(t, index, "(processed_at)")
	})

	t.Run("TwiceIsFine", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := testinfra.NewPool(t)
		require.NoError(t, inbox.Migrate(ctx, pool))
		_, err := pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, message_type, received_at) VALUES ('c', 'm', '', now())`)
		require.NoError(t, err)

		require.NoError(t, inbox.Migrate(ctx, pool))
		require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM inbox_messages`), "migrating again lost rows")
	})

	t.Run("ConcurrentIsFine", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := testinfra.NewPool(t)
		const starts = 8
		errs := make(chan error, starts)
		start := make(chan struct{})
		for range starts {
			go func() {
				<-start
				errs <- inbox.Migrate(ctx, pool)
			}()
		}
		close(start)
		for range starts {
			require.NoError(t, <-errs)
		}
		require.Equal(t, 0, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("RejectsEmptyKeys", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := testinfra.NewPool(t)
		require.NoError(t, inbox.Migrate(ctx, pool))
		_, err := pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, message_type, received_at) VALUES ('c', '', '', now())`)
		require.ErrorContains(t, err, "inbox_messages_message_id_not_empty")
	})
}

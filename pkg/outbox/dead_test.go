package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestDeadRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	got := consume(t, b.amqpURL, b.top.Queue)

	msgs := b.write(t, b.msg("a", 1), b.msg("b", 1))
	_, err := b.pool.Exec(ctx, "UPDATE outbox_messages SET dead_at = now(), attempts = 10, last_error = 'nacked' WHERE id = $1", msgs[0].ID)
	require.NoError(t, err)

	dead, err := outbox.ListDead(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, msgs[0].ID, dead[0].ID)
	require.Equal(t, "nacked", dead[0].LastError)
	require.Equal(t, 10, dead[0].Attempts)
	require.JSONEq(t, string(msgs[0].Payload), string(dead[0].Payload))

	_, err = outbox.ListDead(ctx, b.pool, 0)
	require.Error(t, err)

	b.startRelay(t, b.pool, b.pub, fastConfig(t))
	testinfra.Eventually(t, waitFor, func() bool { return got.len() == 1 }, "live row published")

	n, err := outbox.Requeue(ctx, b.pool, msgs[0].ID, msgs[1].ID) // msgs[1] is not dead: ignored
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testinfra.Eventually(t, waitFor, func() bool { return len(got.ids()) == 2 }, "requeued row published")
	require.Equal(t, 1, got.ids()[msgs[0].ID.String()])
	require.Zero(t, b.count(t, "dead_at IS NOT NULL"))
}

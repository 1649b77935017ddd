package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	s, err := outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, s, "empty outbox")

	msgs := b.write(t, b.msg("a", 1), b.msg("b", 1), b.msg("c", 1))
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET published_at = now() WHERE id = $1", msgs[0].ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE outbox_messages SET dead_at = now() WHERE id = $1", msgs[1].ID)
	require.NoError(t, err)
	s, err = outbox.ReadStats(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Pending)
	require.EqualValues(t, 1, s.Dead)
	require.WithinDuration(t, time.Now(), s.OldestPending, time.Minute)
}

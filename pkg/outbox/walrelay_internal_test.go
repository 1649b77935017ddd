package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestWALBarrierRunsOnTheStreamsServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testinfra.NewPool(t)
	var started time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started))
	w := &WALRelay{db: pool}

	// The stream reads this server: the barrier passes.
	d := &dispatcher{w: w, streamServer: started}
	require.NoError(t, d.barrier(ctx))

	// The pool followed a failover that the stream has not seen yet (or the other way
	// round): a barrier on the new primary proves nothing about the rows the old one sent.
	d = &dispatcher{w: w, streamServer: started.Add(-time.Microsecond)}
	err := d.barrier(ctx)
	require.ErrorContains(t, err, "the replication barrier ran on another server")
	require.ErrorContains(t, err, "a failover")
}

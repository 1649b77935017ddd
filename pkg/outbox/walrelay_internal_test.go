package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// TestWALBarrierHolds: a batch's barrier holds only on the server its stream reads, while
// its own walsender streams the slot. (The barrier's query runs in every TestWALRelay batch;
// the failover and the lost walsender are TestWALRelayFailover's and
// TestWALRelay/AStandbyTakesOverFromARelayThatLostItsWalsender's.)
func TestWALBarrierHolds(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 12, 4, 10, 0, 0, 123456000, time.UTC)
	pid := func(n int64) *int64 { return &n }
	d := &dispatcher{streamServer: started, streamPID: 4242}

	require.NoError(t, d.barrierHeld(started.In(time.FixedZone("x", 3600)), pid(4242)), "the same instant, whatever the zone")

	// The pool followed a failover that the stream has not seen yet (or the other way
	// round): a barrier on the new primary proves nothing about the rows the old one sent.
	err := d.barrierHeld(started.Add(-time.Microsecond), pid(4242))
	require.ErrorContains(t, err, "the replication barrier ran on another server")
	require.ErrorContains(t, err, "a failover")

	// Its walsender is gone (ended by wal_sender_timeout, say): the slot is free, or a
	// standby streams it now.
	for _, reader := range []*int64{nil, pid(77)} {
		err := d.barrierHeld(started, reader)
		require.True(t, errors.Is(err, errSlotInUse), "%v", err)
		require.ErrorContains(t, err, "pid 4242")
	}
}

// TestWidenXids: a streamed transaction's 32-bit id is widened to the xid8 nearest the
// snapshot's xmax, on either side of it and across an epoch boundary either way (a server
// reaches one after 2^32 transactions, so no test server can be taken there).
func TestWidenXids(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t)
	const epoch = int64(1) << 32
	for _, c := range []struct {
		name      string
		xmax, xid int64
		want      int64
	}{
		{"below xmax, the same epoch", 3*epoch + 1000, 990, 3*epoch + 990},
		{"at xmax: committed in the WAL, not yet complete", 3*epoch + 1000, 1000, 3*epoch + 1000},
		{"above xmax, the same epoch", 3*epoch + 1000, 1010, 3*epoch + 1010},
		{"the epoch before, xmax just past a wrap", epoch + 5, epoch - 6, epoch - 6},
		{"the epoch after, xmax just before a wrap", 2*epoch - 3, 2, 2*epoch + 2},
		{"xmax at a wrap, the id just below it", 2 * epoch, epoch - 1, 2*epoch - 1},
		{"2^31 below xmax is still the same epoch", 5*epoch + 1<<31 + 7, 7, 5*epoch + 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got int64
			q := "WITH cur AS (SELECT $2::bigint AS x),\n" + widenXids + "\nSELECT w.id FROM w"
			require.NoError(t, pool.QueryRow(context.Background(), q, []int64{c.xid}, c.xmax).Scan(&got))
			require.Equal(t, c.want, got)
		})
	}
}

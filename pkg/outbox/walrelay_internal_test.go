package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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

// walNopPublisher publishes nothing: the marks below need a relay, not a broker.
type walNopPublisher struct{}

func (walNopPublisher) Publish(_ context.Context, msgs []Message) []error {
	return make([]error, len(msgs))
}

// TestWALMarksOnlyOnTheStreamsServer: a batch's marks run where its rows were streamed
// from, or not at all. With two servers taking writes (an old primary cut off by the
// network and healed before it was fenced), a pool connection on the other one found none
// of the rows, took them for deleted, and the slot moved past rows left pending for ever
// (found by the chaos scenario pg-primary-isolated-wal).
func TestWALMarksOnlyOnTheStreamsServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, Migrate(ctx, pool))
	w, err := NewWALRelay(pool, walNopPublisher{}, Config{}, WALConfig{URL: "postgres://unused/db"})
	require.NoError(t, err)
	msgs := []Message{{Exchange: "x", RoutingKey: "k", Type: "T", AggregateType: "a", AggregateID: "1", Payload: []byte(`{}`)}}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Add(ctx, tx, msgs...) }))
	var here time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&here))
	var pending int
	count := func() int {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages WHERE published_at IS NULL").Scan(&pending))
		return pending
	}
	marks := &marks{published: []pgtype.UUID{{Bytes: msgs[0].ID, Valid: true}}}

	elsewhere := &dispatcher{w: w, streamServer: here.Add(-time.Second)}
	for _, strict := range []bool{true, false} {
		err = elsewhere.mark(ctx, marks, nil, strict)
		require.ErrorContains(t, err, "the marks would run on another server")
		var dbErr databaseError
		require.ErrorAs(t, err, &dbErr, "an outage: the batch is streamed again, never taken for deleted rows")
		require.Equal(t, 1, count(), "nothing marked")
	}

	same := &dispatcher{w: w, streamServer: here}
	require.NoError(t, same.mark(ctx, marks, nil, true))
	require.Zero(t, count(), "marked on the stream's server")
}

// TestWALClassify: the replication errors that mean a setting to change stop the relay
// (ErrWALSetup); a slot dropped between the session's look at it and START_REPLICATION,
// which PostgreSQL reports with the same code as a missing publication ("replication slot
// \"x\" does not exist", 42704, from ReplicationSlotAcquire), is a failure to retry: the
// next session finds the slot gone and creates it again.
func TestWALClassify(t *testing.T) {
	t.Parallel()
	w := &WALRelay{wal: WALConfig{Slot: "outbox_messages"}}
	for _, tc := range []struct {
		code, message string
		setup         bool
	}{
		{"42704", `replication slot "outbox_messages" does not exist`, false},
		{"42704", `publication "outbox_messages" does not exist`, true},
		{"55000", "logical decoding requires wal_level >= logical", true},
		{"42501", "permission denied to start WAL sender", true},
		{"53400", "all replication slots are in use", true},
		{"57P01", "terminating connection due to administrator command", false},
	} {
		err := w.classify(&pgconn.PgError{Code: tc.code, Message: tc.message})
		require.Equal(t, tc.setup, errors.Is(err, ErrWALSetup), "%s %s: %v", tc.code, tc.message, err)
		if !tc.setup {
			var db databaseError
			require.ErrorAs(t, err, &db, "%s: a database failure, retried", tc.message)
		}
	}
}

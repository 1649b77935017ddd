package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxtest"
)

// cuttableDB is a pool whose Begin fails while cut is set: the database unavailable to the
// relay's cycles.
type cuttableDB struct {
	*pgxpool.Pool
	cut atomic.Bool
}

func (d *cuttableDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if d.cut.Load() {
		return nil, errors.New("dial tcp: connection refused")
	}
	return d.Pool.Begin(ctx)
}

// TestRelayReady: ready while Run runs and can publish, or cannot for at most the grace;
// otherwise an error that says what is down, since when, and why; and not ready before Run
// and after it.
func TestRelayReady(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := &cuttableDB{Pool: b.pool}
	var brokerDown atomic.Bool
	pub := &outboxtest.Publisher{Outcome: func(outbox.Message) error {
		if brokerDown.Load() {
			return outbox.ErrUnavailable
		}
		return nil
	}}
	cfg := fastConfig(t)
	cfg.PollInterval = 20 * time.Millisecond
	r, err := outbox.NewRelay(db, pub, cfg)
	require.NoError(t, err)
	require.ErrorContains(t, r.Ready(time.Hour), "relay not started")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testinfra.Eventually(t, waitFor, func() bool { return r.Ready(0) == nil }, "ready once Run runs")

	const grace = 200 * time.Millisecond
	for _, tc := range []struct {
		name  string
		state outbox.State
		cut   func(bool)
		want  string
	}{
		{"Broker", outbox.StateBrokerUnavailable, brokerDown.Store, "cannot publish to the broker for"},
		{"Database", outbox.StateDatabaseUnavailable, db.cut.Store, "cannot reach the database for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cut(true)
			b.write(t, b.msg(tc.name, 1)) // an idle relay would not try the broker
			testinfra.Eventually(t, waitFor, func() bool { return r.State() == tc.state }, "the relay finds it down")
			require.NoError(t, r.Ready(time.Hour), "unable for less than the grace")
			testinfra.Eventually(t, waitFor, func() bool { return r.Ready(grace) != nil }, "not ready past the grace")
			err := r.Ready(grace)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "(since ")
			if tc.state == outbox.StateBrokerUnavailable {
				require.ErrorIs(t, err, outbox.ErrUnavailable, "the last error")
			} else {
				require.ErrorContains(t, err, "connection refused", "the last error")
			}
			tc.cut(false)
			testinfra.Eventually(t, waitFor, func() bool { return r.Ready(0) == nil }, "ready again")
		})
	}

	cancel()
	require.NoError(t, <-done)
	require.ErrorContains(t, r.Ready(time.Hour), "relay stopped")
}

package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// sizedPool opens a pool of at most maxConns connections on b's database.
func sizedPool(t *testing.T, b *bundle, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// unsizedDB is a RelayDB that does not tell its pool's size.
type unsizedDB struct{ pool *pgxpool.Pool }

func (d unsizedDB) Begin(ctx context.Context) (pgx.Tx, error) { return d.pool.Begin(ctx) }
func (d unsizedDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.pool.Exec(ctx, sql, args...)
}
func (d unsizedDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) { return d.pool.Acquire(ctx) }

func TestPoolSize(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("Sizes", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			maxConns      int32
			disableNotify bool
			inFlight      int
			want          outbox.PoolSize
			warned        bool
		}{
			// A connection per batch in flight (2 by default) and one for maintenance.
			// LISTEN's connection is hijacked from the pool: it does not count.
			"ListeningWithThree":   {3, false, 0, outbox.PoolSize{Needed: 3, Max: 3}, false},
			"ListeningWithTwo":     {2, false, 0, outbox.PoolSize{Needed: 3, Max: 2}, true},
			"PollingWithThree":     {3, true, 0, outbox.PoolSize{Needed: 3, Max: 3}, false},
			"PollingWithOne":       {1, true, 0, outbox.PoolSize{Needed: 3, Max: 1}, true},
			"SerialWithTwo":        {2, false, 1, outbox.PoolSize{Needed: 2, Max: 2}, false},
			"SerialWithOne":        {1, false, 1, outbox.PoolSize{Needed: 2, Max: 1}, true},
			"FourInFlightWithFour": {4, false, 4, outbox.PoolSize{Needed: 5, Max: 4}, true},
			"PgxpoolDefaultOfFour": {0, false, 0, outbox.PoolSize{Needed: 3, Max: 4}, false}, // pgxpool: max(4, CPUs)
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				pool := b.pool
				if tc.maxConns > 0 {
					pool = sizedPool(t, b, tc.maxConns)
				} else {
					// pgxpool's default is max(4, CPUs): 4 on a small machine, more on a larger one.
					require.GreaterOrEqual(t, pool.Stat().MaxConns(), int32(4))
					tc.want.Max = int(pool.Stat().MaxConns())
				}
				var logs bytes.Buffer
				r, err := outbox.NewRelay(pool, fakePublisher{}, outbox.Config{
					DisableNotify: tc.disableNotify, InFlightBatches: tc.inFlight, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				})
				require.NoError(t, err)
				require.Equal(t, tc.want, r.PoolSize())
				require.Equal(t, tc.want.Needed-tc.want.Max > 0, r.PoolSize().Shortfall() > 0)
				if tc.warned {
					require.Contains(t, logs.String(), "the pool is smaller than the relay needs")
				} else {
					require.Empty(t, logs.String())
				}
			})
		}
	})

	t.Run("OneConnectionListens", func(t *testing.T) {
		// The listener takes its connection out of the pool (Hijack), which frees its slot:
		// a pool of one connection still runs cycles, and notifications still wake them.
		t.Parallel()
		b := setup(t) // a table and a queue of its own: no other relay nor consumer
		got := consume(t, b.amqpURL, b.top.Queue)
		pool := sizedPool(t, b, 1)
		cfg := fastConfig(t)
		cfg.PollInterval = time.Hour // only a notification can start a cycle after the first
		b.startRelay(t, pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n))
			return n > 0
		}, "the relay listens")
		for i := range 3 {
			m := b.write(t, b.msg("one-conn-listen", i))[0]
			testinfra.Eventually(t, waitFor, func() bool { return got.ids()[m.ID.String()] > 0 },
				"message %d published through a pool of one that listens", i)
			require.LessOrEqual(t, pool.Stat().TotalConns(), int32(1))
		}
	})

	t.Run("UnknownSize", func(t *testing.T) {
		t.Parallel()
		r, err := outbox.NewRelay(unsizedDB{sizedPool(t, b, 1)}, fakePublisher{}, outbox.Config{})
		require.NoError(t, err, "a pool that does not tell its size is not checked")
		require.Equal(t, outbox.PoolSize{Needed: 3}, r.PoolSize())
		require.Zero(t, r.PoolSize().Shortfall())
	})

	t.Run("TooSmallOnlySlowsDown", func(t *testing.T) {
		// One connection for a relay that wants three: it publishes all the same, its batches
		// taking turns at the connection.
		t.Parallel()
		got := consume(t, b.amqpURL, b.top.Queue)
		pool := sizedPool(t, b, 1)
		msgs := b.write(t, b.msg("small-pool", 1), b.msg("small-pool", 2), b.msg("small-pool", 3))
		cfg := fastConfig(t)
		cfg.DisableNotify = true
		b.startRelay(t, pool, b.pub, cfg)
		testinfra.Eventually(t, waitFor, func() bool {
			ids := got.ids()
			for _, m := range msgs {
				if ids[m.ID.String()] == 0 {
					return false
				}
			}
			return true
		}, "published through a pool of one")
	})
}

package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

const poolWarning = "rabbitmq consumer: the pool is smaller than Concurrency; handlers will wait for connections"

// sizedPool opens a pool of at most maxConns connections on b's database.
func (b *bundle) sizedPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// unsizedPool is a pool that does not tell its size.
type unsizedPool struct{ pool *pgxpool.Pool }

func (p unsizedPool) Begin(ctx context.Context) (pgx.Tx, error) { return p.pool.Begin(ctx) }

func TestPoolSize(t *testing.T) {
	t.Parallel()

	t.Run("Sizes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, tc := range map[string]struct {
			maxConns    int32
			concurrency int
			want        inboxrabbitmq.PoolSize
		}{
			"Enough":    {8, 8, inboxrabbitmq.PoolSize{Needed: 8, Max: 8}},
			"TooSmall":  {2, 8, inboxrabbitmq.PoolSize{Needed: 8, Max: 2}},
			"OneByOne":  {1, 1, inboxrabbitmq.PoolSize{Needed: 1, Max: 1}},
			"Defaulted": {4, 0, inboxrabbitmq.PoolSize{Needed: inboxrabbitmq.DefaultPrefetch, Max: 4}},      // Concurrency = Prefetch = 32
			"Batched":   {4, -1, inboxrabbitmq.PoolSize{Needed: inboxrabbitmq.DefaultPrefetch / 8, Max: 4}}, // Concurrency = Prefetch / BatchSize
		} {
			t.Run(name, func(t *testing.T) {
				logs := &logStore{}
				cfg := b.config(recordEffect)
				cfg.Prefetch, cfg.Concurrency, cfg.BatchSize = 0, tc.concurrency, 1
				if tc.concurrency > 0 {
					cfg.Prefetch = tc.concurrency
				}
				if tc.concurrency < 0 {
					cfg.Concurrency, cfg.BatchSize = 0, 8
				}
				cfg.Logger = slog.New(&recordHandler{store: logs})
				c, err := inboxrabbitmq.NewConsumer(b.sizedPool(t, tc.maxConns), cfg)
				require.NoError(t, err)
				require.Equal(t, tc.want, c.PoolSize())
				short := tc.want.Needed - tc.want.Max
				require.Equal(t, max(0, short), c.PoolSize().Shortfall())
				warnings := logs.find(poolWarning)
				if short <= 0 {
					require.Empty(t, warnings)
					return
				}
				require.Len(t, warnings, 1)
				require.Equal(t, slog.LevelWarn, warnings[0].level)
				require.EqualValues(t, tc.want.Max, warnings[0].attrs["pool_max_conns"])
				require.EqualValues(t, tc.want.Needed, warnings[0].attrs["connections_needed"])
			})
		}
	})

	t.Run("UnknownSize", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(recordEffect)
		cfg.BatchSize = 1
		c, err := inboxrabbitmq.NewConsumer(unsizedPool{b.sizedPool(t, 1)}, cfg)
		require.NoError(t, err)
		require.Equal(t, inboxrabbitmq.PoolSize{Needed: 8}, c.PoolSize())
		require.Zero(t, c.PoolSize().Shortfall())
		require.Empty(t, b.logs.find(poolWarning))
	})

	t.Run("TooSmallOnlySlowsDown", func(t *testing.T) {
		// Eight handlers at once on two connections: every message is processed once.
		t.Parallel()
		b := setup(t)
		cfg := b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.02)`); err != nil { // hold the connection a while
				return err
			}
			return recordEffect(ctx, tx, d)
		})
		cfg.Concurrency = 8
		b.start(t, b.sizedPool(t, 2), cfg)
		const n = 40
		for i := range n {
			b.publish(t, jsonMessage(fmt.Sprintf("m-%d", i)))
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			processed, _ := b.events.counts()
			return processed == n
		}, "all messages processed through a pool of two")
		for i := range n {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("m-%d", i)))
		}
		require.Len(t, b.logs.find(poolWarning), 1)
	})
}

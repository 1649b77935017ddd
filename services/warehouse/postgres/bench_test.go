package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// BenchmarkReserveHot is the warehouse consumer's reservation under contention: 8 workers
// (the consumer's default concurrency), each reserving one-line orders of five SKUs in turn,
// each in a transaction of its own that commits, so that every worker queues for the row
// lock of a hot SKU. It reports reservations per second.
func BenchmarkReserveHot(b *testing.B) {
	bb := setup(b)
	skus := []string{"HOT-1", "HOT-2", "HOT-3", "HOT-4", "HOT-5"}
	levels := map[string]int64{}
	for _, s := range skus {
		levels[s] = 1 << 40
	}
	bb.setStock(b, levels)
	const workers = 8
	ctx := context.Background()
	var (
		next atomic.Int64
		errs = make([]error, workers)
	)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
					d, err := postgres.Reserve(ctx, tx, newOrderID(), []warehouse.Line{{SKU: skus[i%int64(len(skus))], Quantity: 1}}, fmt.Sprint(i), time.Now())
					if err == nil && d.Action != warehouse.ActionReserve {
						err = fmt.Errorf("decision %s", d)
					}
					return err
				})
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		require.NoError(b, err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reservations/s")
}

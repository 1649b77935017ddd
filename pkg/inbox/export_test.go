package inbox

import (
	"context"
	"log/slog"
	"time"
)

// DropPartitionsBefore drops the partitions of s's partitioned table whose range ended by
// cutoff, as Cleanup does with its retention's cutoff.
func DropPartitionsBefore(ctx context.Context, s *Store, db any, cutoff time.Time) (int64, error) {
	return s.dropPartitions(ctx, db, cutoff, slog.New(slog.DiscardHandler))
}

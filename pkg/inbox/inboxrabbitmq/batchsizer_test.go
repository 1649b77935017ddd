package inboxrabbitmq

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestBatchSizer(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	b := newBatchSizer(16)
	require.Equal(t, 16, b.size(start), "full size at first")
	b.ran(start, false)
	require.Equal(t, 16, b.size(start.Add(time.Hour)), "never above BatchSize")

	// Each conflict halves the size, down to 1.
	for _, want := range []int{8, 4, 2, 1, 1} {
		b.ran(start, true)
		require.Equal(t, want, b.size(start))
	}
	// It grows back by one per second without a conflict.
	require.Equal(t, 1, b.size(start.Add(999*time.Millisecond)))
	require.Equal(t, 2, b.size(start.Add(time.Second)))
	require.Equal(t, 2, b.size(start.Add(1500*time.Millisecond)))
	require.Equal(t, 5, b.size(start.Add(4*time.Second)))
	b.ran(start.Add(4*time.Second), false) // a clean batch changes nothing
	require.Equal(t, 16, b.size(start.Add(time.Minute)))

	one := newBatchSizer(1)
	one.ran(start, true)
	require.Equal(t, 1, one.size(start))
}

func TestLockConflict(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"40P01": true, "40001": true, "55P03": true,
		"23505": false, "08006": false, "57014": false, "": false,
	} {
		err := fmt.Errorf("handle message %q: %w", "m", &pgconn.PgError{Code: code})
		require.Equal(t, want, lockConflict(err), code)
	}
	require.False(t, lockConflict(nil))
	require.False(t, lockConflict(errors.New("deadlock detected")))
}

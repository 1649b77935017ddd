package orders_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/orders"
)

var allStatuses = []orders.Status{
	orders.StatusPending, orders.StatusReserved, orders.StatusRejected, orders.StatusCancelling, orders.StatusCancelled,
}

func TestNext(t *testing.T) {
	t.Parallel()
	// The legal transitions of docs/events.md; every other pair must be refused.
	legal := map[[2]string]orders.Status{
		{string(orders.StatusPending), orders.EventStockReserved}:    orders.StatusReserved,
		{string(orders.StatusPending), orders.EventStockRejected}:    orders.StatusRejected,
		{string(orders.StatusPending), orders.EventOrderCancelled}:   orders.StatusCancelling,
		{string(orders.StatusReserved), orders.EventOrderCancelled}:  orders.StatusCancelling,
		{string(orders.StatusCancelling), orders.EventStockReleased}: orders.StatusCancelled,
	}
	events := []string{orders.EventStockReserved, orders.EventStockRejected, orders.EventStockReleased,
		orders.EventOrderCancelled, orders.EventOrderCreated, "Unknown"}
	for _, from := range allStatuses {
		for _, ev := range events {
			t.Run(fmt.Sprintf("%s_%s", from, ev), func(t *testing.T) {
				t.Parallel()
				to, ok := orders.Next(from, ev)
				want, wantOK := legal[[2]string{string(from), ev}]
				require.Equal(t, wantOK, ok)
				if wantOK {
					require.Equal(t, want, to)
				} else {
					require.Equal(t, from, to, "an illegal transition leaves the status")
				}
			})
		}
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	want := map[orders.Status]orders.CancelOutcome{
		orders.StatusPending:    orders.CancelStart,
		orders.StatusReserved:   orders.CancelStart,
		orders.StatusCancelling: orders.CancelAlready,
		orders.StatusCancelled:  orders.CancelAlready,
		orders.StatusRejected:   orders.CancelRefused,
	}
	for _, s := range allStatuses {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			require.True(t, s.Valid())
			require.Equal(t, want[s], orders.Cancel(s))
		})
	}
	require.False(t, orders.Status("SHIPPED").Valid())
}

func TestError(t *testing.T) {
	t.Parallel()
	cause := errors.New("connection refused")
	err := fmt.Errorf("create order: %w", orders.Wrap(orders.CodeUnavailable, cause, "The database is unavailable."))
	require.Equal(t, orders.CodeUnavailable, orders.ErrorCode(err))
	require.Equal(t, "The database is unavailable.", orders.ErrorMessage(err))
	require.ErrorIs(t, err, cause)

	plain := errors.New("boom")
	require.Equal(t, orders.CodeInternal, orders.ErrorCode(plain))
	require.Equal(t, "Internal error.", orders.ErrorMessage(plain), "the cause of an unexpected error is never shown")
	require.Empty(t, orders.ErrorCode(nil))
}

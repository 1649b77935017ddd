package warehouse_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse"
)

func TestCheckStock(t *testing.T) {
	t.Parallel()

	lines := []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 5}}
	for _, tc := range []struct {
		name      string
		lines     []warehouse.Line
		available map[string]int64
		want      warehouse.Decision
	}{
		{
			name:      "every line fits",
			lines:     lines,
			available: map[string]int64{"BOOK-1": 10, "MUG-1": 10},
			want:      warehouse.Decision{Action: warehouse.ActionReserve},
		},
		{
			name:      "exact stock fits",
			lines:     lines,
			available: map[string]int64{"BOOK-1": 2, "MUG-1": 5},
			want:      warehouse.Decision{Action: warehouse.ActionReserve},
		},
		{
			name:      "one short line rejects the whole order",
			lines:     lines,
			available: map[string]int64{"BOOK-1": 10, "MUG-1": 4},
			want: warehouse.Decision{Action: warehouse.ActionReject, Reason: warehouse.ReasonInsufficientStock,
				Shortages: []warehouse.Shortage{{SKU: "MUG-1", Requested: 5, Available: 4}}},
		},
		{
			name:      "an unknown SKU rejects with unknown_sku and lists every shortage",
			lines:     lines,
			available: map[string]int64{"BOOK-1": 1},
			want: warehouse.Decision{Action: warehouse.ActionReject, Reason: warehouse.ReasonUnknownSKU,
				Shortages: []warehouse.Shortage{{SKU: "BOOK-1", Requested: 2, Available: 1}, {SKU: "MUG-1", Requested: 5, Available: 0}}},
		},
		{
			name:      "zero stock rejects",
			lines:     lines[:1],
			available: map[string]int64{"BOOK-1": 0},
			want: warehouse.Decision{Action: warehouse.ActionReject, Reason: warehouse.ReasonInsufficientStock,
				Shortages: []warehouse.Shortage{{SKU: "BOOK-1", Requested: 2, Available: 0}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, warehouse.CheckStock(tc.lines, tc.available))
		})
	}
}

func TestDecideCreated(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		existing *warehouse.Reservation
		want     warehouse.Action
		reason   string
	}{
		{name: "new order is reserved", existing: nil, want: warehouse.ActionReserve},
		{name: "tombstone rejects with order_cancelled",
			existing: &warehouse.Reservation{Status: warehouse.StatusCancelled, CancelledMessageID: "c1"},
			want:     warehouse.ActionReject, reason: warehouse.ReasonOrderCancelled},
		{name: "tombstone that saw its order already is ignored",
			existing: &warehouse.Reservation{Status: warehouse.StatusCancelled, CreatedMessageID: "m1", CancelledMessageID: "c1"},
			want:     warehouse.ActionIgnore},
		{name: "reserved order is ignored", existing: &warehouse.Reservation{Status: warehouse.StatusReserved, CreatedMessageID: "m1"},
			want: warehouse.ActionIgnore},
		{name: "rejected order is ignored", existing: &warehouse.Reservation{Status: warehouse.StatusRejected, CreatedMessageID: "m1"},
			want: warehouse.ActionIgnore},
		{name: "released order is ignored", existing: &warehouse.Reservation{Status: warehouse.StatusReleased, CreatedMessageID: "m1"},
			want: warehouse.ActionIgnore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := warehouse.DecideCreated(tc.existing)
			require.Equal(t, tc.want, d.Action)
			require.Equal(t, tc.reason, d.Reason)
			if d.Action == warehouse.ActionIgnore {
				require.NotEmpty(t, d.Why)
			}
		})
	}
}

func TestDecideCancelled(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		existing *warehouse.Reservation
		want     warehouse.Action
	}{
		{name: "unknown order leaves a tombstone", existing: nil, want: warehouse.ActionTombstone},
		{name: "reserved order is released", existing: &warehouse.Reservation{Status: warehouse.StatusReserved}, want: warehouse.ActionRelease},
		{name: "rejected order is acknowledged", existing: &warehouse.Reservation{Status: warehouse.StatusRejected}, want: warehouse.ActionAcknowledgeCancel},
		{name: "rejected order cancelled twice is ignored",
			existing: &warehouse.Reservation{Status: warehouse.StatusRejected, CancelledMessageID: "c1"}, want: warehouse.ActionIgnore},
		{name: "released order is ignored", existing: &warehouse.Reservation{Status: warehouse.StatusReleased, CancelledMessageID: "c1"},
			want: warehouse.ActionIgnore},
		{name: "tombstone is ignored", existing: &warehouse.Reservation{Status: warehouse.StatusCancelled, CancelledMessageID: "c1"},
			want: warehouse.ActionIgnore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, warehouse.DecideCancelled(tc.existing).Action)
		})
	}
}

func TestMergeLines(t *testing.T) {
	t.Parallel()

	t.Run("merges per SKU and sorts", func(t *testing.T) {
		t.Parallel()
		got := warehouse.MergeLines([]warehouse.Line{{SKU: "MUG-1", Quantity: 1}, {SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 3}})
		require.Equal(t, []warehouse.Line{{SKU: "BOOK-1", Quantity: 2}, {SKU: "MUG-1", Quantity: 4}}, got)
	})
	t.Run("status holds only when reserved", func(t *testing.T) {
		t.Parallel()
		require.True(t, warehouse.StatusReserved.Holds())
		for _, s := range []warehouse.Status{warehouse.StatusRejected, warehouse.StatusReleased, warehouse.StatusCancelled} {
			require.False(t, s.Holds(), s)
		}
	})
	t.Run("events never carry null lists", func(t *testing.T) {
		t.Parallel()
		id := uuid.New()
		require.NotNil(t, warehouse.NewStockReleased(id, nil, nowUTC()).Items)
		require.NotNil(t, warehouse.NewStockReserved(id, nil, nowUTC()).Items)
		require.NotNil(t, warehouse.NewStockRejected(id, warehouse.ReasonOrderCancelled, nil, nowUTC()).Shortages)
	})
}

func TestValidSKU(t *testing.T) {
	t.Parallel()

	for _, c := range warehouse.Catalogue {
		require.True(t, warehouse.ValidSKU(c.SKU), c.SKU)
	}
	for _, bad := range []string{"", "-A", "A B", "A/B", "é", string(make([]byte, 65))} {
		require.False(t, warehouse.ValidSKU(bad), "%q", bad)
	}
}

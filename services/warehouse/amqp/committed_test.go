package amqp_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
)

// TestHandlerCommitted checks that Committed reports a decision once its transaction
// committed, and only then: not after a rollback, not for a duplicate, not for a message that
// changes nothing.
func TestHandlerCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var (
		mu      sync.Mutex
		actions []warehouse.Action
	)
	h := warehouseamqp.NewHandler(b.top.Exchange, testLogger(t))
	h.Committed = func(d warehouse.Decision) {
		mu.Lock()
		defer mu.Unlock()
		actions = append(actions, d.Action)
	}
	reported := func() []warehouse.Action {
		mu.Lock()
		defer mu.Unlock()
		return append([]warehouse.Action(nil), actions...)
	}
	errAfter := errors.New("fails after the handler")
	process := func(db inbox.TxBeginner, m message, after error) (bool, error) {
		before := len(reported())
		return inbox.Process(ctx, db, warehouseamqp.ConsumerName, inbox.Message{ID: m.ID, Type: m.Type},
			func(ctx context.Context, tx pgx.Tx) error {
				if err := h.Handle(ctx, tx, rabbitmq.Delivery{ID: m.ID, Type: m.Type, Body: m.Body, DeliveryCount: 1}); err != nil {
					return err
				}
				require.Len(t, reported(), before, "reported before the commit")
				return after
			})
	}
	db := aftercommit.Wrap(b.pool)

	order := uuid.Must(uuid.NewV7())
	created := orderCreated(t, order, warehouse.Line{SKU: "BOOK-1", Quantity: 1})
	_, err := process(db, created, errAfter)
	require.ErrorIs(t, err, errAfter)
	require.Empty(t, reported(), "rolled back")

	duplicate, err := process(db, created, nil)
	require.NoError(t, err)
	require.False(t, duplicate)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported())

	duplicate, err = process(db, created, nil)
	require.NoError(t, err)
	require.True(t, duplicate)
	again := orderCreated(t, order, warehouse.Line{SKU: "BOOK-1", Quantity: 1}) // another id: ignored
	_, err = process(db, again, nil)
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported(), "a duplicate and an ignored message")

	_, err = process(b.pool, orderCancelled(t, order), nil) // not wrapped: nothing tells the commit
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported())
	require.Equal(t, warehouse.StatusReleased, b.reservation(t, order).Status)

	_, err = process(db, orderCreated(t, uuid.Must(uuid.NewV7()), warehouse.Line{SKU: "BAG-1", Quantity: 11}), nil)
	require.NoError(t, err)
	other := uuid.Must(uuid.NewV7())
	_, err = process(db, orderCreated(t, other, warehouse.Line{SKU: "MUG-1", Quantity: 1}), nil)
	require.NoError(t, err)
	_, err = process(db, orderCancelled(t, other), nil)
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve, warehouse.ActionReject, warehouse.ActionReserve, warehouse.ActionRelease}, reported())
}

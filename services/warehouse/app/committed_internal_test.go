package app

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// TestCountingApplier checks that the consumer's store reports a decision once its
// transaction committed, and only then: not after a rollback, not for a duplicate, not for a
// message that changes nothing.
func TestCountingApplier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t)
	require.NoError(t, postgres.Migrate(ctx, pool))
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		actions []warehouse.Action
	)
	h := warehouseamqp.NewHandler(countingApplier{OrderApplier: store, committed: func(d warehouse.Decision) {
		mu.Lock()
		defer mu.Unlock()
		actions = append(actions, d.Action)
	}}, warehouseamqp.HandlerConfig{})
	reported := func() []warehouse.Action {
		mu.Lock()
		defer mu.Unlock()
		return append([]warehouse.Action(nil), actions...)
	}
	type message struct {
		ID, Type string
		Body     []byte
	}
	event := func(typ string, body map[string]any) message {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		return message{ID: uuid.Must(uuid.NewV7()).String(), Type: typ, Body: b}
	}
	created := func(id uuid.UUID, sku string, quantity int) message {
		return event(warehouse.TypeOrderCreated, map[string]any{
			"version": 1, "order_id": id, "items": []warehouse.Line{{SKU: sku, Quantity: int64(quantity)}},
		})
	}
	cancelled := func(id uuid.UUID) message {
		return event(warehouse.TypeOrderCancelled, map[string]any{"version": 1, "order_id": id})
	}
	errAfter := errors.New("fails after the handler")
	process := func(db inbox.TxBeginner, m message, after error) (bool, error) {
		before := len(reported())
		return inbox.Process(ctx, db, warehouseamqp.ConsumerName, inbox.Message{ID: m.ID, Type: m.Type},
			func(ctx context.Context, tx pgx.Tx) error {
				if err := h(ctx, tx, inboxrabbitmq.Delivery{ID: m.ID, Type: m.Type, Body: m.Body, DeliveryCount: 1}); err != nil {
					return err
				}
				require.Len(t, reported(), before, "reported before the commit")
				return after
			})
	}
	db := aftercommit.Wrap(pool)

	order := uuid.Must(uuid.NewV7())
	first := created(order, "BOOK-1", 1)
	_, err = process(db, first, errAfter)
	require.ErrorIs(t, err, errAfter)
	require.Empty(t, reported(), "rolled back")

	duplicate, err := process(db, first, nil)
	require.NoError(t, err)
	require.False(t, duplicate)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported())

	duplicate, err = process(db, first, nil)
	require.NoError(t, err)
	require.True(t, duplicate)
	_, err = process(db, created(order, "BOOK-1", 1), nil) // another id: ignored
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported(), "a duplicate and an ignored message")

	_, err = process(pool, cancelled(order), nil) // not wrapped: nothing tells the commit
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve}, reported())
	r, err := store.GetReservation(ctx, order)
	require.NoError(t, err)
	require.Equal(t, warehouse.StatusReleased, r.Status)

	_, err = process(db, created(uuid.Must(uuid.NewV7()), "BAG-1", 11), nil)
	require.NoError(t, err)
	other := uuid.Must(uuid.NewV7())
	_, err = process(db, created(other, "MUG-1", 1), nil)
	require.NoError(t, err)
	_, err = process(db, cancelled(other), nil)
	require.NoError(t, err)
	require.Equal(t, []warehouse.Action{warehouse.ActionReserve, warehouse.ActionReject, warehouse.ActionReserve, warehouse.ActionRelease}, reported())
}

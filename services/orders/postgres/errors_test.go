package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/orders"
)

// TestErrorsKeepTheirSQLSTATE makes the database refuse a stock update (a reason with NUL,
// which the event decoder would have refused before) and checks that the error still carries
// the *pgconn.PgError: the consumer classifies it by SQLSTATE (22: the message's fault), so
// it must not be flattened to text on the way.
func TestErrorsKeepTheirSQLSTATE(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := b.create(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.store.ApplyStockUpdate(ctx, tx, orders.StockUpdate{
			Event: orders.EventStockRejected, OrderID: o.ID, Reason: "x\x00", MessageID: "m-nul",
		})
		return err
	})
	require.Error(t, err)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "%T: %v", err, err)
	require.Equal(t, "22021", pgErr.Code)
	require.Equal(t, orders.CodeInternal, orders.ErrorCode(err), "not a 503: trying again does not help")
}

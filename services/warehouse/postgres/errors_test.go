package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// TestErrorsKeepTheirSQLSTATE makes the database refuse a reservation (a SKU with NUL, which
// the event decoder would have refused before) and checks that the error still carries the
// *pgconn.PgError: the consumer classifies it by SQLSTATE (22: the message's fault), so it
// must not be flattened to text on the way.
func TestErrorsKeepTheirSQLSTATE(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := postgres.Reserve(ctx, tx, newOrderID(), []warehouse.Line{{SKU: "A\x00", Quantity: 1}}, "m-nul", time.Now())
		return err
	})
	require.Error(t, err)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "%T: %v", err, err)
	require.Equal(t, "22021", pgErr.Code)
	require.False(t, postgres.Transient(err))

	deadlock := &pgconn.PgError{Code: "40P01"}
	require.True(t, postgres.Transient(deadlock), "a deadlock is worth another try")
}

package testinfra_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// TestPasswordServer: the private server trusts postgres, and lets another role in with its
// password only.
func TestPasswordServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := testinfra.StartPasswordServer(t)
	admin, err := pgx.Connect(ctx, s.URL("postgres"))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE ROLE shop LOGIN PASSWORD 'right'")
	require.NoError(t, err)

	as := func(password string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", url.UserPassword("shop", password), s.Port)
	}
	conn, err := pgx.Connect(ctx, as("right"))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	_, err = pgx.Connect(ctx, as("wrong"))
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "28P01", pgErr.Code, "invalid_password")
}

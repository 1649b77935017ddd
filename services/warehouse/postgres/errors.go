package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxshop/outboxshop/services/warehouse"
)

// dbError wraps err, the failure of op, with context; when the database cannot be reached
// it becomes a *warehouse.Error with CodeUnavailable, which the API answers with 503.
func dbError(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*warehouse.Error](err); ok {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", op, err)
	if Unavailable(err) {
		return &warehouse.Error{Code: warehouse.CodeUnavailable, Message: "The database is unavailable; try again shortly.", Err: wrapped}
	}
	return wrapped
}

// Unavailable reports whether err means that the database cannot be reached or cannot serve
// now (connection refused or lost, a timeout, the server shutting down or out of
// connections), as opposed to a failure of the statement itself.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection_exception
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now
			pgErr.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF)
}

// Transient reports whether retrying the transaction that failed with err may succeed: a
// deadlock, a serialization failure, or an unavailable database.
func Transient(err error) bool {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return Unavailable(err)
}

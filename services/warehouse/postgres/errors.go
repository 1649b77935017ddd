package postgres

import (
	"errors"
	"fmt"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// dbError wraps err, the failure of op, with context (%w: the *pgconn.PgError stays
// reachable, for the consumer to classify by SQLSTATE); when trying again may succeed
// ([Transient]) it becomes a *warehouse.Error with CodeUnavailable, which the API answers
// with 503 and Retry-After.
func dbError(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*warehouse.Error](err); ok {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", op, err)
	if Transient(err) {
		return &warehouse.Error{Code: warehouse.CodeUnavailable, Message: "The database is unavailable; try again shortly.", Err: wrapped}
	}
	return wrapped
}

// Transient reports whether retrying the work that failed with err may succeed: the database
// cannot be reached or cannot serve now (SQLSTATE classes 08, 53, 57, a lost connection, a
// timeout), or a deadlock or serialization failure (40P01, 40001). It is internal/pgdb's
// classification, the one both services use.
func Transient(err error) bool { return pgdb.Transient(err) }

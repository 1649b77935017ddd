package postgres

import "github.com/outboxshop/outboxshop/internal/pgdb"

// dbError wraps err, the failure of op, as internal/pgdb Wrap does for both services: nil as
// it is, a *warehouse.Error as it is, a *warehouse.Error with CodeUnavailable (503 with
// Retry-After) when trying again may succeed ([Transient]), "op: err" otherwise; the
// *pgconn.PgError stays reachable, for the consumer to classify by SQLSTATE.
func dbError(op string, err error) error { return pgdb.Wrap(op, err) }

// Transient reports whether retrying the work that failed with err may succeed: the database
// cannot be reached or cannot serve now (SQLSTATE classes 08, 53, 57, a lost connection, a
// timeout), or a deadlock or serialization failure (40P01, 40001). It is internal/pgdb's
// classification, the one both services use.
func Transient(err error) bool { return pgdb.Transient(err) }

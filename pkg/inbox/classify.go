package inbox

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// Class says what retrying a failed message can achieve. [Classify] assigns it; a consumer
// runner such as the inboxrabbitmq subpackage acts on it.
type Class int

const (
	// ClassFailed: the attempt failed and nothing says why (SQLSTATE classes 22, 23 and 42
	// among others). The message may be at fault, or the code handling it; a retry may
	// succeed once something else changed (a row it refers to arrived). Runners count such
	// an attempt and give up after a bounded number (inboxrabbitmq: MaxDeliveries).
	ClassFailed Class = iota
	// ClassTransient: the infrastructure failed, not the message (the database is
	// unreachable, restarting, out of connections or resources, the connection was lost),
	// or the transaction lost a race that a retry wins (serialization failure, deadlock,
	// lock not available). Retrying the same message later succeeds once the cause is
	// gone. Runners retry it without counting an attempt, so an outage of any length never
	// uses up a message's attempts.
	ClassTransient
	// ClassPermanent: the error was marked with [Permanent]: no retry can help. Runners
	// dead-letter the message at once.
	ClassPermanent
)

// String returns "failed", "transient" or "permanent", for logs and metric labels.
func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	default:
		return "failed"
	}
}

// Classify tells whether a failed attempt to process a message is worth retrying and whether
// the retry should count, as the inboxrabbitmq runner does for handlers and [Process].
//
// The first rule that matches decides:
//
//  1. nil is ClassFailed (there is nothing to classify; callers check for nil first).
//  2. An explicit mark: the outermost [Permanent] or [Transient] in err's chain.
//  3. A connection that could not be established (*pgconn.ConnectError, including a
//     refused password or a missing database: the operator fixes those, not the message)
//     and a closed pgxpool (puddle.ErrClosedPool) are ClassTransient.
//  4. A PostgreSQL error (*pgconn.PgError) by its SQLSTATE: ClassTransient for class 08
//     (connection exception), 53 (insufficient resources), 57 (operator intervention:
//     admin or crash shutdown, cannot connect now, and 57014 query_canceled, which is
//     how a statement_timeout ends a statement; an overloaded database is an outage, so a
//     slow message is held rather than dead-lettered), 58 (system error, such as I/O),
//     40 (transaction rollback: 40001 serialization_failure, 40P01 deadlock_detected),
//     55P03 lock_not_available, 55006 object_in_use, 25006 read_only_sql_transaction (a
//     standby after a failover) and 25P03/25P04 (the server ended an idle or too long
//     transaction); ClassFailed for every other code, among them 22, 23 and 42.
//  5. A context deadline (context.DeadlineExceeded: a DB call's own deadline) and a
//     timeout inside pgx (pgconn.Timeout) are ClassTransient. context.Canceled is
//     ClassFailed: a runner's own shutdown cancels its contexts, and the runner must check
//     its context before it classifies (inboxrabbitmq does); a cancellation from
//     anywhere else is not evidence of an outage.
//  6. A lost or broken connection is ClassTransient: io.EOF and io.ErrUnexpectedEOF (the
//     server closed the connection), pgconn.ErrConnClosed, errors pgx reports as
//     pgconn.SafeToRetry (the statement never reached the server), *net.OpError and
//     *net.DNSError, a net.Error timeout, and the errnos ECONNREFUSED, ECONNRESET,
//     ECONNABORTED, EPIPE, ETIMEDOUT, EHOSTUNREACH and ENETUNREACH.
//  7. Anything else is ClassFailed.
//
// A handler that calls other services over the network gets rule 6 for their failures
// too: an unreachable dependency holds the message instead of using up its attempts. Wrap
// an error with [Permanent] or [Transient] to decide otherwise.
func Classify(err error) Class {
	if err == nil {
		return ClassFailed
	}
	if m, ok := errors.AsType[classMark](err); ok {
		return m.inboxClass()
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return ClassTransient
	}
	if errors.Is(err, puddle.ErrClosedPool) {
		return ClassTransient
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return ClassifySQLState(pgErr.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return ClassTransient
	}
	if errors.Is(err, context.Canceled) {
		return ClassFailed
	}
	if connectionLost(err) {
		return ClassTransient
	}
	return ClassFailed
}

// ClassifySQLState is rule 4 of [Classify]: the class of a PostgreSQL error code.
func ClassifySQLState(code string) Class {
	switch code {
	case "55P03", // lock_not_available
		"55006", // object_in_use
		"25006", // read_only_sql_transaction
		"25P03", // idle_in_transaction_session_timeout
		"25P04": // transaction_timeout
		return ClassTransient
	case "40002": // transaction_integrity_constraint_violation: a deferred constraint failed at commit
		return ClassFailed
	}
	if len(code) != 5 {
		return ClassFailed
	}
	switch code[:2] {
	case "08", // connection_exception
		"40", // transaction_rollback: serialization_failure, deadlock_detected, … (not 40002)
		"53", // insufficient_resources: disk_full, out_of_memory, too_many_connections
		"57", // operator_intervention: query_canceled, admin_shutdown, cannot_connect_now, …
		"58": // system_error: io_error, …
		return ClassTransient
	}
	return ClassFailed
}

// connectionLost is rule 6 of [Classify].
func connectionLost(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.SafeToRetry(err) {
		return true
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	// A syscall.Errno is a net.Error too, whatever its origin (a missing file, say), so
	// only timeouts count here, and the network errnos below.
	if netErr, ok := errors.AsType[net.Error](err); ok && netErr.Timeout() {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
		syscall.EPIPE, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// Permanent marks err as permanent ([ClassPermanent]): retrying the message cannot help (it
// is invalid, refers to something that does not exist, breaks a business rule).
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether the outermost class mark in err's chain is [Permanent] (so
// [Classify] puts err in [ClassPermanent]). IsPermanent(nil) is false.
func IsPermanent(err error) bool { return err != nil && Classify(err) == ClassPermanent }

// Transient marks err as transient ([ClassTransient]): the message is fine, something it
// depends on is not (a service it calls is down, a row it needs is locked). Use it only for
// failures that end by themselves: a message whose handler returns a transient error for
// ever is never dead-lettered. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether [Classify] puts err in [ClassTransient]: it was marked with
// [Transient], or it is an infrastructure failure or a lost race that a retry may win.
func IsTransient(err error) bool { return err != nil && Classify(err) == ClassTransient }

// classMark is implemented by the marks of Permanent and Transient; errors.As finds the
// outermost one.
type classMark interface {
	error
	inboxClass() Class
}

// permanentError is the mark of [Permanent] (transientError that of [Transient]).
// pkg/outbox marks its permanent errors the same way, so that the two libraries read alike:
//   - a pointer, so that errors.Is compares marks by identity: comparing two struct values
//     compares the errors they wrap, which panics when those are of an uncomparable type;
//   - no prefix on the message: a mark classifies an error, it adds no context, so Error
//     is the wrapped error's text; what acts on the class says so where it matters (the
//     consumer's dead-letter reason, permanent-error: …).
type permanentError struct{ err error }

func (e *permanentError) Error() string     { return e.err.Error() }
func (e *permanentError) Unwrap() error     { return e.err }
func (e *permanentError) inboxClass() Class { return ClassPermanent }

type transientError struct{ err error }

func (e *transientError) Error() string     { return e.err.Error() }
func (e *transientError) Unwrap() error     { return e.err }
func (e *transientError) inboxClass() Class { return ClassTransient }

// isDataException reports whether err carries a PostgreSQL data exception (class 22) or a
// program limit (class 54, e.g. an index row too large): what a value, not the
// infrastructure, caused.
func isDataException(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54"))
}

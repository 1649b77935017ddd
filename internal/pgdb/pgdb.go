// Package pgdb opens a service's PostgreSQL database and classifies PostgreSQL errors.
//
// [Open] creates the database when it does not exist, opens a pool, pings it and migrates
// it. A server that is not there yet (a container still starting, a failover in progress)
// is waited for: every step is retried with backoff (internal/retry), until the context
// ends, and the wait is logged once: a line when the first attempt fails, at most one per
// [Config].LogInterval while it goes on, and "database ready" with how long it took. Only a configuration error ends the wait early: a URL that does not parse, a
// server that refuses the credentials, a migration the server rejects. So a service can
// start before its database, as it may in docker compose or Kubernetes, and exits only when
// a human has to act.
//
// [Transient] is the one classification of PostgreSQL errors the services use: worth
// retrying (the server is unreachable, shutting down or out of resources; a deadlock or a
// serialization failure) or not (the statement or its data is at fault).
//
// [InTx] is the one way the services run a transaction whose outcome they answer a client
// with: it commits with pkg/outbox's CommitReplicated, so that nothing is acknowledged that
// is on the primary alone and could be lost in a failover (docs/failover.md).
package pgdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/internal/tlsfiles"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// Defaults of [Config].
const (
	DefaultConnectTimeout  = 5 * time.Second
	DefaultRetryDelay      = 250 * time.Millisecond
	DefaultMaxRetryDelay   = 10 * time.Second
	DefaultDeadPeerTimeout = 10 * time.Second
)

// Config configures [Open].
type Config struct {
	// URL of the database (postgres://…). Required.
	URL string
	// MaxConns bounds the pool. 0: pgx's default.
	MaxConns int32
	// ConnectTimeout bounds one connection attempt. Default 5s.
	ConnectTimeout time.Duration
	// DeadPeerTimeout is how long a connection lives on once the server stopped answering
	// at the TCP level, as across a network partition, where nothing resets the connection:
	// data sent and not acknowledged for that long (TCP_USER_TIMEOUT, on Linux), or an idle
	// connection whose keepalive probes go unanswered for about that long, closes it, and
	// the statement waiting on it fails as an outage. Without it a statement sent into a
	// partition waits for the kernel's retransmissions, a quarter of an hour, or for the
	// caller's context, and a LISTEN waits for ever. A slow server is not a dead one: its
	// kernel acknowledges what it is sent, so a long statement, or a commit waiting for a
	// synchronous standby, is not cut short. A server that stops reading for that long while
	// the client still sends (a COPY or a pipeline larger than the socket buffers, its backend
	// blocked on a lock) looks dead too. Default 10s ([DefaultDeadPeerTimeout]); negative:
	// none, the kernel's defaults.
	DeadPeerTimeout time.Duration
	// Migrate brings the schema up to date; it runs on every start and must be idempotent.
	// Optional.
	Migrate func(ctx context.Context, pool *pgxpool.Pool) error
	// RetryDelay is the wait after the first failed attempt; it doubles per attempt up to
	// MaxRetryDelay, jittered (each wait between half and all of that: retry.Backoff).
	// Defaults 250ms and 10s.
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration
	// LogInterval is the least time between two lines about the same wait. Default
	// retry.DefaultLogInterval (30s).
	LogInterval time.Duration
	// Logger gets the wait for the server (retry.Streak's lines, named "open database": one
	// when the first attempt fails, with the error; at most one per LogInterval after that,
	// with how many attempts failed) and "database ready" when the database is, with the
	// attempts it took and how long it waited: the line that ends a wait. nil discards.
	Logger *slog.Logger
	// Tracer traces the pool's queries (internal/pgtrace). nil traces nothing.
	Tracer pgx.QueryTracer
	// TLS are the CA and the client certificate of the connection, added to URL by
	// [WithTLSFiles]. None: the URL says it all.
	TLS tlsfiles.Files
	// Setting is the prefix of the settings of the URL and the TLS files ("ORDERS_DATABASE_"),
	// for errors: a certificate refused names them.
	Setting string
}

// WithTLSFiles returns dbURL with the files of f as its sslrootcert, sslcert and sslkey, for
// a connection that checks the server's certificate against the CA of f and shows f's client
// certificate: dbURL as it is when f has none. dbURL must then be a postgres:// URL that says
// sslmode=verify-full and none of those parameters itself. setting names the settings in
// errors ("ORDERS_DATABASE_": ORDERS_DATABASE_URL, ORDERS_DATABASE_CA_FILE, …), which never
// hold the URL: it may hold a password.
func WithTLSFiles(dbURL string, f tlsfiles.Files, setting string) (string, error) {
	if !f.Set() {
		return dbURL, nil
	}
	files := setting + "CA_FILE, " + setting + "CERT_FILE or " + setting + "KEY_FILE"
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%sURL must be a postgres:// URL when %s is set", setting, files)
	}
	q := u.Query()
	if mode := q.Get("sslmode"); mode != "verify-full" {
		return "", fmt.Errorf("%sURL says sslmode=%s, and %s is set: say sslmode=verify-full, so that the server's certificate "+
			"is checked against the CA and the URL's host name", setting, cmp.Or(mode, "(nothing: prefer)"), files)
	}
	for _, p := range []string{"sslrootcert", "sslcert", "sslkey"} {
		if q.Has(p) {
			return "", fmt.Errorf("%sURL says %s, and %s is set: give the files in the settings alone", setting, p, files)
		}
	}
	// Appended to the query as it is: re-encoding it (url.Values.Encode) would write a space
	// as "+", which libpq's parser, and pgx's, read as a plus, in the user's own parameters
	// and in the files' paths alike.
	for _, p := range [][2]string{{"sslrootcert", f.CA}, {"sslcert", f.Cert}, {"sslkey", f.Key}} {
		if p[1] == "" {
			continue
		}
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += p[0] + "=" + strings.ReplaceAll(url.QueryEscape(p[1]), "+", "%20")
	}
	return u.String(), nil
}

// ConfigError is an error that waiting will not fix: the configuration, the credentials or a
// migration must change.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return "database configuration: " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Migrate creates the database of cfg.URL when it does not exist and migrates it (Open),
// then closes it: a service's `migrate` subcommand. log gets Open's lines and "database
// migrated"; nil discards.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg.Logger = cmp.Or(log, slog.New(slog.DiscardHandler))
	pool, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	pool.Close()
	cfg.Logger.InfoContext(ctx, "database migrated")
	return nil
}

// Open creates the database of cfg.URL when it does not exist, opens a pool on it, pings it
// and runs cfg.Migrate. While a step fails with a [Transient] error it tries again with
// backoff (see [Config].RetryDelay), logging the wait once (see [Config].Logger), until ctx
// ends (then it returns ctx's error, wrapping the last failure). Any other failure is
// returned at once as a *ConfigError.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	dbURL, err := WithTLSFiles(cfg.URL, cfg.TLS, cfg.Setting)
	if err != nil {
		return nil, &ConfigError{err}
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, &ConfigError{fmt.Errorf("parse database url: %w", err)}
	}
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = cfg.MaxConns
	}
	pcfg.ConnConfig.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, DefaultConnectTimeout)
	if d := cmp.Or(cfg.DeadPeerTimeout, DefaultDeadPeerTimeout); d > 0 {
		pcfg.ConnConfig.DialFunc = deadPeerDialer(d).DialContext
	}
	if cfg.Tracer != nil {
		pcfg.ConnConfig.Tracer = cfg.Tracer
	}
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)).With(
		slog.String("database", pcfg.ConnConfig.Database), slog.String("host", pcfg.ConnConfig.Host))
	// Backoff: RetryDelay (250ms) doubling to MaxRetryDelay (10s), jittered; the streak
	// logs the first failure and then at most one line per LogInterval. Its recovery line is
	// "database ready" below, so Succeed is never called.
	base := cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	waiting := &retry.Streak{
		What: "open database", Logger: log, LogInterval: cfg.LogInterval,
		Backoff: retry.Backoff{Base: base, Max: max(cmp.Or(cfg.MaxRetryDelay, DefaultMaxRetryDelay), base)},
	}

	start := time.Now()
	for attempt := 1; ; attempt++ {
		pool, err := open(ctx, pcfg, cfg.Migrate)
		if err == nil {
			log.InfoContext(ctx, "database ready", slog.Int("attempts", attempt),
				slog.Duration("waited", time.Since(start).Round(time.Millisecond)))
			return pool, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open database: gave up after %d attempts: %w (last: %w)", attempt, ctx.Err(), err)
		}
		if !Transient(err) {
			if serverWithoutTLS(err) {
				err = fmt.Errorf("the server does not take TLS, which the sslmode of %[1]sURL requires: check the host and port of "+
					"%[1]sURL, and the server's ssl setting: %[2]w", cmp.Or(cfg.Setting, "the database "), err)
			}
			if tlsfiles.Refused(err) {
				err = fmt.Errorf("the TLS handshake failed; check that %[1]sCA_FILE is the CA that signed the "+
					"server's certificate, that the certificate names the host of %[1]sURL (%[2]s), and that %[1]sCERT_FILE and "+
					"%[1]sKEY_FILE are a client certificate the server accepts: %[3]w", cmp.Or(cfg.Setting, "the database "), pcfg.ConnConfig.Host, err)
			}
			return nil, &ConfigError{err}
		}
		if !retry.Sleep(ctx, waiting.Fail(ctx, err)) {
			return nil, fmt.Errorf("open database: gave up after %d attempts: %w (last: %w)", attempt, ctx.Err(), err)
		}
	}
}

// open is one attempt of Open.
func open(ctx context.Context, pcfg *pgxpool.Config, migrate func(context.Context, *pgxpool.Pool) error) (*pgxpool.Pool, error) {
	if err := EnsureDatabase(ctx, pcfg.ConnConfig); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg.Copy())
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	if migrate != nil {
		if err := migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	return pool, nil
}

// EnsureDatabase connects to cfg's database and, when the server answers that it does not
// exist, creates it from the server's "postgres" database. Another process creating it at
// the same moment is no error.
func EnsureDatabase(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err == nil {
		return conn.Close(ctx)
	}
	if !hasCode(err, "3D000") { // invalid_catalog_name
		return fmt.Errorf("connect to database %q: %w", cfg.Database, err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to the postgres database to create %q: %w", cfg.Database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // a connection we are done with
	// CREATE DATABASE takes no parameters; the name is quoted as an identifier.
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if hasCode(err, "42P04") || hasCode(err, "23505") {
		// duplicate_database, or the unique index of pg_database when another process
		// created it at the same moment: either way it exists now.
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", cfg.Database, err)
	}
	return nil
}

// serverWithoutTLS reports whether err is pgconn's answer to a server that refused the TLS
// a connection asked for (sslmode=require or stricter): a server with ssl=off. pgconn has no
// error value for it, only this text (pgx v5; e2e's TestSecretsStaySecret fails if it changes).
func serverWithoutTLS(err error) bool {
	_, ok := errors.AsType[*pgconn.ConnectError](err)
	return ok && strings.Contains(err.Error(), "server refused TLS connection")
}

func hasCode(err error, code string) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == code
}

// Transient reports whether err may go away if the same work is tried again, as opposed to
// an error of the statement or its data. A PostgreSQL error is classified by its SQLSTATE
// exactly as the inbox classifies it (inbox.ClassifySQLState: the classes 08 connection
// exception, 40 transaction rollback, 53 insufficient resources, 57 operator intervention,
// 58 system error, and lock_not_available, object_in_use, a read-only transaction, the
// idle-in-transaction and transaction timeouts), so that the APIs, the start-up and the
// consumers agree; everything else (22 data exception, 23 integrity violation, 42 syntax or
// access rule, 28 invalid authorization, …) is not. Without a SQLSTATE: a connection that
// could not be made or was lost, a timeout and a cancelled context are transient, and so is
// a commit whose outcome is unknown (outbox.ErrCommitUnknown: [InTx]'s wait for the
// synchronous standby ended with its context). The HTTP APIs answer a transient error with
// 503 and Retry-After.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, outbox.ErrCommitUnknown) {
		return true
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return inbox.ClassifySQLState(pgErr.Code) == inbox.ClassTransient
	}
	if tlsfiles.Refused(err) || serverWithoutTLS(err) {
		// A certificate refused in the handshake, or a server without TLS: a configuration,
		// or a certificate, must change.
		return false
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// UnavailableMessage is the caller-facing message of an error [Wrap] classifies as
// apperr.CodeUnavailable.
const UnavailableMessage = "The database is unavailable; try again shortly."

// Wrap wraps err, the failure of op, with context for a service's PostgreSQL adapter: nil
// stays nil and an *apperr.Error (a domain refusal) is returned as it is; when trying again
// may succeed ([Transient]) it becomes an *apperr.Error with CodeUnavailable, which the API
// answers with 503 and Retry-After; anything else is wrapped as "op: err". The cause stays
// reachable (%w), so a *pgconn.PgError can still be classified by SQLSTATE.
func Wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*apperr.Error](err); ok {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", op, err)
	if Transient(err) {
		return apperr.Wrap(apperr.CodeUnavailable, wrapped, UnavailableMessage)
	}
	return wrapped
}

// TxBeginner begins a transaction; *pgxpool.Pool and *pgx.Conn implement it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

var (
	_ TxBeginner = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgx.Conn)(nil)
)

// InTx runs fn in a transaction begun on db with opts and, when fn returns nil, commits with
// outbox.CommitReplicated; when fn returns an error (or panics) it rolls back and returns
// fn's error as it is, for the caller to [Wrap].
//
// Use it for every transaction whose outcome a service answers a client with, a read as
// much as a write: when it returns nil, what the transaction wrote and what it read is on
// the synchronous standbys (when the server has any) and survives a failover to one of
// them. A plain Commit of a transaction that only read waits for no standby, yet what it
// read may be on the primary alone: a commit whose wait for the standby was cut short is
// visible there at once, and so is whatever a primary restarted after a crash replays.
// Answering 201 or 200 from such a read tells the client of something the failover will
// undo.
//
// A commit that ctx ended while it waited for the standby returns an error (wrapping
// outbox.ErrCommitUnknown when the commit itself returned; [Transient] either way: 503, the
// client retries); with a single synchronous standby that is down, every InTx waits for it
// until ctx ends. Without synchronous standbys it costs one cheap statement more than a
// plain commit (docs/benchmarks.md).
func InTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer rollback(ctx, tx) // after a commit it does nothing
	if err := fn(tx); err != nil {
		return err
	}
	return outbox.CommitReplicated(ctx, tx)
}

// rollback ends tx, also when ctx has ended, within a few seconds; pgx closes the
// connection itself when the rollback fails. After a commit it returns at once.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// DBTX is what a service adapter's queries need, the same in both services: pgx.Tx,
// *pgx.Conn and *pgxpool.Pool satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ DBTX = pgx.Tx(nil)
	_ DBTX = (*pgx.Conn)(nil)
	_ DBTX = (*pgxpool.Pool)(nil)
)

package pgdb_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/retry"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestTransient(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }
	for _, err := range []error{
		pg("08006"), pg("08001"), pg("53300"), pg("53200"), pg("57P01"), pg("57P03"), pg("57014"), pg("40001"), pg("40P01"),
		context.DeadlineExceeded, context.Canceled, io.EOF, io.ErrUnexpectedEOF, pgconn.ErrConnClosed, net.ErrClosed,
		&net.OpError{Op: "dial", Err: errors.New("connection refused")},
	} {
		require.True(t, pgdb.Transient(err), "%v", err)
	}
	for _, err := range []error{
		nil, errors.New("bug"), pg("22021"), pg("23505"), pg("23503"), pg("42601"), pg("42P01"), pg("28P01"), pg("3D000"), pg("40002"),
	} {
		require.False(t, pgdb.Transient(err), "%v", err)
	}
}

func TestWrap(t *testing.T) {
	t.Parallel()
	require.NoError(t, pgdb.Wrap("op", nil))

	refusal := apperr.Errorf(apperr.CodeNotFound, "No such thing.")
	require.Same(t, refusal, pgdb.Wrap("op", refusal), "a domain refusal passes as it is")

	down := &pgconn.PgError{Code: "57P01"}
	err := pgdb.Wrap("load thing", down)
	require.Equal(t, apperr.CodeUnavailable, apperr.ErrorCode(err))
	require.Equal(t, pgdb.UnavailableMessage, apperr.ErrorMessage(err))
	require.ErrorIs(t, err, down)
	require.ErrorContains(t, err, "load thing: ")

	bad := &pgconn.PgError{Code: "22021"}
	err = pgdb.Wrap("save thing", bad)
	require.Equal(t, apperr.CodeInternal, apperr.ErrorCode(err), "not worth another try: not a 503")
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok)
	require.Equal(t, "22021", pgErr.Code, "the SQLSTATE stays reachable")
	require.EqualError(t, err, "save thing: "+bad.Error())
}

// logBuffer collects log lines from concurrent writers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// freshDatabaseURL returns the URL of a database that does not exist yet, through host
// (host:port), and drops it when the test ends.
func freshDatabaseURL(t *testing.T, host string) string {
	t.Helper()
	admin := testinfra.PostgresURL(t)
	u, err := url.Parse(admin)
	require.NoError(t, err)
	name := testinfra.UniqueName(t, "t")
	if len(name) > 63 {
		name = name[:63]
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	u.Path = "/" + name
	if host != "" {
		u.Host = host
	}
	return u.String()
}

func TestOpen(t *testing.T) {
	t.Parallel()

	// The server is away for cut from the start: Open's connection attempts through the
	// proxy are held to what its backoff allows, its log to one line when the wait starts,
	// one per LogInterval and "database ready" with the wait. A loop that retried without a
	// delay would dial thousands of times.
	t.Run("waits for a server that comes later, then creates and migrates the database", func(t *testing.T) {
		t.Parallel()
		const (
			cut         = 3 * time.Second
			logInterval = time.Second
		)
		backoff := retry.Backoff{Base: 100 * time.Millisecond, Max: time.Second}
		u, err := url.Parse(testinfra.PostgresURL(t))
		require.NoError(t, err)
		proxy := testinfra.NewProxy(t, u.Host)
		proxy.Cut()
		logger, logs := testinfra.NewLogs(t)
		migrated := 0
		type result struct {
			pool *pgxpool.Pool
			err  error
		}
		done := make(chan result, 1)
		dbURL := freshDatabaseURL(t, proxy.Addr())
		go func() {
			pool, err := pgdb.Open(context.Background(), pgdb.Config{
				URL: dbURL, MaxConns: 3, ConnectTimeout: time.Second,
				RetryDelay: backoff.Base, MaxRetryDelay: backoff.Max, LogInterval: logInterval,
				Migrate: func(ctx context.Context, pool *pgxpool.Pool) error {
					migrated++
					_, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (id int)")
					return err
				},
				Logger: logger,
			})
			done <- result{pool, err}
		}()
		testinfra.Eventually(t, 10*time.Second, func() bool { return proxy.Dials() > 0 }, "a first attempt")
		<-time.After(cut) // the outage's length, not a synchronisation
		select {
		case r := <-done:
			t.Fatalf("Open returned while the server was away: %v", r.err)
		default:
		}
		dials := proxy.Dials()
		proxy.Heal()
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Open did not return once the server was back")
		}
		require.NoError(t, r.err)
		defer r.pool.Close()
		require.Equal(t, 1, migrated)
		_, err = r.pool.Exec(context.Background(), "INSERT INTO t VALUES (1)")
		require.NoError(t, err, "the database exists and is migrated")

		// An attempt fails at its first step, the connection to the database, which dials
		// twice: pgx follows a connection the server dropped with a cancel request on a
		// connection of its own. +1 attempt for the one under way when the outage ended.
		const dialsPerAttempt = 2
		bound := dialsPerAttempt * (backoff.MaxAttempts(cut) + 1)
		warns := logs.Count(slog.LevelWarn, "")
		t.Logf("%d dials in a %s outage (at most %d), %d Warn lines", dials, cut, bound, warns)
		require.LessOrEqual(t, dials, int64(bound), "dials in a %s outage", cut)
		require.GreaterOrEqual(t, dials, int64(3), "Open retries")
		require.Equal(t, 1, logs.Count(slog.LevelWarn, "open database: failing"), logs.String(slog.LevelDebug))
		require.LessOrEqual(t, warns, 1+int(cut/logInterval), "Warn lines of a %s outage:\n%s", cut, logs.String(slog.LevelDebug))
		require.Zero(t, logs.Count(slog.LevelError, ""))
		require.Zero(t, logs.Count(slog.LevelInfo, "recovered"), "database ready is the line that ends the wait")
		var ready []testinfra.LogRecord
		for _, rec := range logs.Records() {
			if rec.Msg == "database ready" {
				ready = append(ready, rec)
			}
		}
		require.Len(t, ready, 1)
		require.Contains(t, ready[0].Attrs, "waited=")
		require.NotContains(t, ready[0].Attrs, "attempts=1 ", "it took several attempts")
	})

	t.Run("gives up when the context ends", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // a closed port: every attempt is refused
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err = pgdb.Open(ctx, pgdb.Config{URL: "postgres://postgres@" + addr + "/x", RetryDelay: 10 * time.Millisecond})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var cfgErr *pgdb.ConfigError
		require.False(t, errors.As(err, &cfgErr))
	})

	t.Run("returns a configuration error at once", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(testinfra.PostgresURL(t))
		require.NoError(t, err)
		u.User = url.User("no_such_role_" + strings.ToLower(testinfra.UniqueName(t, "r")[:8]))
		for name, cfg := range map[string]pgdb.Config{
			"an unparsable URL": {URL: "postgres://%zz"},
			"an unknown role":   {URL: u.String()},
			"a failing migration": {URL: freshDatabaseURL(t, ""), Migrate: func(ctx context.Context, pool *pgxpool.Pool) error {
				_, err := pool.Exec(ctx, "CREATE TABLE syntax error")
				return err
			}},
		} {
			start := time.Now()
			_, err := pgdb.Open(context.Background(), cfg)
			var cfgErr *pgdb.ConfigError
			require.True(t, errors.As(err, &cfgErr), "%s: %v", name, err)
			require.Less(t, time.Since(start), 5*time.Second, name)
		}
	})

	t.Run("opens a database that exists as it is", func(t *testing.T) {
		t.Parallel()
		pool := testinfra.NewPool(t)
		_, err := pool.Exec(context.Background(), "CREATE TABLE kept (id int)")
		require.NoError(t, err)
		opened, err := pgdb.Open(context.Background(), pgdb.Config{URL: pool.Config().ConnString(), MaxConns: 2})
		require.NoError(t, err)
		defer opened.Close()
		_, err = opened.Exec(context.Background(), "INSERT INTO kept VALUES (1)")
		require.NoError(t, err)
	})

	t.Run("another process creating the database at the same time is no error", func(t *testing.T) {
		t.Parallel()
		dbURL := freshDatabaseURL(t, "")
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				pool, err := pgdb.Open(context.Background(), pgdb.Config{URL: dbURL, MaxConns: 2})
				if err == nil {
					pool.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	})
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testinfra.PostgresURL(t))
	require.NoError(t, err)
	dbURL := freshDatabaseURL(t, u.Host)
	logs := &logBuffer{}
	cfg := pgdb.Config{URL: dbURL, Migrate: func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (id int)")
		return err
	}}
	require.NoError(t, pgdb.Migrate(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil))))
	require.NoError(t, pgdb.Migrate(context.Background(), cfg, nil), "again: a no-op")
	require.Equal(t, 1, logs.count("database migrated"))

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), "INSERT INTO t VALUES (1)")
	require.NoError(t, err, "the database exists and is migrated")
}

// Package testinfra gives tests a real PostgreSQL database and RabbitMQ broker of their own.
//
// It finds the servers through OUTBOXSHOP_TEST_POSTGRES_URL and OUTBOXSHOP_TEST_AMQP_URL.
// When those are unset and a Docker engine answers, it starts them once per test binary with
// testcontainers-go. When neither is possible the test is skipped with a clear message, except
// under CI=true, where missing infrastructure fails the test.
//
// Every test gets a fresh database (dropped afterwards) and unique exchange and queue names,
// so tests run in parallel without seeing each other's rows or messages.
//
// The package imports nothing else from this repository, so that the folder it lives in can
// be copied on its own. internal/testinfra is the source: pkg/outbox and pkg/inbox each keep
// a generated copy in their internal/testinfra, so that either library folder can be copied
// alone. Edit the source and run go generate ./internal/testinfra; a test in tools fails
// when a copy differs from the source.
package testinfra

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcrabbitmq "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
	"go.uber.org/goleak"
)

// Environment variables read by this package.
const (
	EnvPostgresURL = "OUTBOXSHOP_TEST_POSTGRES_URL"
	EnvAMQPURL     = "OUTBOXSHOP_TEST_AMQP_URL"
)

// Images started when no server is configured and Docker is available.
const (
	postgresImage = "postgres:15.10-alpine"
	rabbitmqImage = "rabbitmq:3.10.25-management-alpine"
)

var (
	pgOnce, amqpOnce sync.Once
	pgURL, amqpURL   string
	pgErr, amqpErr   error
	containersMu     sync.Mutex
	containers       []testcontainers.Container
)

// Main runs the tests, stops any container or cluster this package started, and fails the run
// when a test leaked a goroutine. Call it from TestMain.
//
// Examples find the servers through the environment variables only. When those are unset,
// Main starts the containers first and exports their URLs; when it cannot, the examples are
// skipped with a message (they cannot skip themselves), and under CI=true the run fails.
func Main(m *testing.M) {
	if os.Getenv(EnvPostgresURL) == "" || os.Getenv(EnvAMQPURL) == "" {
		// Start the containers now, so that examples find them through the environment.
		pgOnce.Do(startPostgres)
		amqpOnce.Do(startRabbitMQ)
		if err := errors.Join(pgErr, amqpErr); err != nil {
			if os.Getenv("CI") == "true" {
				fmt.Fprintf(os.Stderr, "CI=true and no test infrastructure: %v\n", err)
				os.Exit(1)
			}
			flag.Parse()
			skip := "^Example"
			if s := flag.Lookup("test.skip").Value.String(); s != "" {
				skip = s + "|" + skip
			}
			_ = flag.Set("test.skip", skip)
			fmt.Fprintf(os.Stderr, "examples skipped, tests will skip: %v\n", err)
		} else {
			_ = os.Setenv(EnvPostgresURL, pgURL)
			_ = os.Setenv(EnvAMQPURL, amqpURL)
		}
	}
	code := m.Run()
	stopSharedCluster()
	containersMu.Lock()
	for _, c := range containers {
		_ = c.Terminate(context.Background())
	}
	containersMu.Unlock()
	if code == 0 {
		if err := goleak.Find(
			// pgx closes pooled connections in the background; testcontainers keeps a reaper.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
			goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s unavailable: %v (set %s and %s, or run a Docker engine)", what, err, EnvPostgresURL, EnvAMQPURL)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so missing infrastructure is a failure")
	}
	t.Skip(msg)
}

// dockerAvailable reports whether a Docker engine answers, without panicking when none does.
func dockerAvailable(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("docker health: %w", err)
	}
	return nil
}

func keep(c testcontainers.Container) {
	containersMu.Lock()
	containers = append(containers, c)
	containersMu.Unlock()
}

// PostgresURL returns the URL of a PostgreSQL server on which tests may create databases.
func PostgresURL(t testing.TB) string {
	t.Helper()
	pgOnce.Do(startPostgres)
	if pgErr != nil {
		unavailable(t, "PostgreSQL", pgErr)
	}
	return pgURL
}

// AMQPURL returns the URL of a RabbitMQ broker.
func AMQPURL(t testing.TB) string {
	t.Helper()
	amqpOnce.Do(startRabbitMQ)
	if amqpErr != nil {
		unavailable(t, "RabbitMQ", amqpErr)
	}
	return amqpURL
}

func startPostgres() {
	if u := os.Getenv(EnvPostgresURL); u != "" {
		pgURL = u
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if pgErr = dockerAvailable(ctx); pgErr != nil {
		pgErr = fmt.Errorf("%s is unset and %w", EnvPostgresURL, pgErr)
		return
	}
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if c != nil {
		keep(c)
	}
	if err != nil {
		pgErr = fmt.Errorf("start postgres container: %w", err)
		return
	}
	pgURL, pgErr = c.ConnectionString(ctx, "sslmode=disable")
}

func startRabbitMQ() {
	if u := os.Getenv(EnvAMQPURL); u != "" {
		amqpURL = u
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if amqpErr = dockerAvailable(ctx); amqpErr != nil {
		amqpErr = fmt.Errorf("%s is unset and %w", EnvAMQPURL, amqpErr)
		return
	}
	c, err := tcrabbitmq.Run(ctx, rabbitmqImage)
	if c != nil {
		keep(c)
	}
	if err != nil {
		amqpErr = fmt.Errorf("start rabbitmq container: %w", err)
		return
	}
	amqpURL, amqpErr = c.AmqpURL(ctx)
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns a name no other test uses, readable in logs and broker listings:
// the prefix, the test name and a random suffix.
func UniqueName(t testing.TB, prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 30 {
		name = name[len(name)-30:]
	}
	return fmt.Sprintf("%s_%s_%s", prefix, strings.Trim(name, "_"), hex.EncodeToString(b))
}

// DatabaseURL creates a fresh, empty database and returns its URL. The database is dropped
// when the test ends.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	admin := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	defer conn.Close(ctx)
	name := UniqueName(t, "t")
	if len(name) > 63 {
		name = name[:63]
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvPostgresURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool returns a pool on a fresh database; it is closed and dropped when the test ends.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return openPool(t, DatabaseURL(t))
}

// QueryExecModes are pgx's query exec modes, by the name a connection string's
// default_query_exec_mode takes.
var QueryExecModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// NewPoolInMode is NewPool whose connections run their queries in the exec mode of that
// name, a key of QueryExecModes.
func NewPoolInMode(t testing.TB, mode string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(DatabaseURL(t))
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	pool := openPool(t, u.String())
	if want, got := QueryExecModes[mode], pool.Config().ConnConfig.DefaultQueryExecMode; got != want {
		t.Fatalf("the pool runs queries in exec mode %v, not %v", got, want)
	}
	return pool
}

func openPool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered by DatabaseURL
	return pool
}

// Topology is an exchange and a queue bound to it by a routing key pattern, unique to a test.
type Topology struct {
	Exchange, Queue string
}

// DeclareTopology declares a durable topic exchange and a durable queue bound with "#", both
// deleted when the test ends.
func DeclareTopology(t testing.TB, amqpURL string) Topology {
	t.Helper()
	top := Topology{Exchange: UniqueName(t, "ex"), Queue: UniqueName(t, "q")}
	withChannel(t, amqpURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(top.Exchange, "topic", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(top.Queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(top.Queue, "#", top.Exchange, false, nil)
	})
	t.Cleanup(func() {
		withChannel(t, amqpURL, func(ch *amqp.Channel) error {
			if _, err := ch.QueueDelete(top.Queue, false, false, false); err != nil {
				return err
			}
			return ch.ExchangeDelete(top.Exchange, false, false)
		})
	})
	return top
}

// DeleteExchangeAtCleanup deletes the exchange name when the test ends: an auto-delete
// exchange that never had a binding is never deleted by the broker.
func DeleteExchangeAtCleanup(t testing.TB, amqpURL, name string) {
	t.Helper()
	t.Cleanup(func() {
		withChannel(t, amqpURL, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
	})
}

func withChannel(t testing.TB, amqpURL string, fn func(*amqp.Channel) error) {
	t.Helper()
	conn, err := DialAMQP(amqpURL)
	if err != nil {
		unavailable(t, "RabbitMQ", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	if err := fn(ch); err != nil {
		t.Fatalf("declare topology: %v", err)
	}
}

// Eventually polls cond every few milliseconds until it returns true or the deadline passes,
// then fails the test with msg.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: "+msg, append([]any{timeout}, args...)...)
		}
		<-tick.C
	}
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// env is what every phase shares: the servers, the run id that names everything the run
// creates, the progress output, and the clean-ups that leave the servers as they were.
type env struct {
	cfg   Config
	id    string
	log   *slog.Logger
	start time.Time

	mu       sync.Mutex
	cleanups []func(context.Context) error
	// The backlog template of the drain and memory phases (see backlog), under setupMu.
	setupMu     sync.Mutex
	backlogDB   string
	backlogRows int
	drainTop    *topology
	// The template of item 10's databases (see walTemplate), under setupMu.
	walTemplateDB string
	// The broker's pid on this machine, found once (see brokerPID); 0 when not found.
	brokerOnce sync.Once
	brokerPid  int
}

func newEnv(cfg Config) *env {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &env{cfg: cfg, id: hex.EncodeToString(b), log: log, start: time.Now()}
}

// progress writes one line to the progress output, stamped with the time since the start.
func (e *env) progress(format string, args ...any) {
	w := e.cfg.Progress
	if w == nil {
		w = io.Discard
	}
	fmt.Fprintf(w, "bench %5.0fs  %s\n", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...))
}

// later registers a clean-up; close runs them in reverse order.
func (e *env) later(f func(context.Context) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

// close runs every clean-up, also when ctx was cancelled (Ctrl-C), and returns their errors.
func (e *env) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	e.mu.Lock()
	fs := slices.Clone(e.cleanups)
	e.cleanups = nil
	e.mu.Unlock()
	var errs []error
	for _, f := range slices.Backward(fs) {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// dbName returns the name of the run's database for suffix.
func (e *env) dbName(suffix string) string { return "bench_" + e.id + "_" + suffix }

// amqpName returns the name of the run's exchange or queue for suffix.
func (e *env) amqpName(suffix string) string { return "bench." + e.id + "." + suffix }

// databaseURL returns the URL of database name on the configured server.
func (e *env) databaseURL(name string) (string, error) {
	u, err := url.Parse(e.cfg.PostgresURL)
	if err != nil {
		return "", fmt.Errorf("parse PostgreSQL URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// adminExec runs sql on the configured database (CREATE/DROP DATABASE).
func (e *env) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// createDatabase creates the run's database for suffix, from template when it is not
// empty, and drops it at the end of the run. It returns the database's URL.
func (e *env) createDatabase(ctx context.Context, suffix, template string) (string, error) {
	name := e.dbName(suffix)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := e.adminExec(ctx, sql); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	e.later(func(ctx context.Context) error { return e.dropDatabase(ctx, name) })
	return e.databaseURL(name)
}

// dropDatabase drops a database of the run (forcing its connections closed).
func (e *env) dropDatabase(ctx context.Context, name string) error {
	if err := e.adminExec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// openPool opens a pool of at most maxConns connections on dbURL, closed at the end of the
// run (closing twice is harmless).
func openPool(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping %s: %w", cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// dial connects to the broker with a connection name that shows in the management UI.
func (e *env) dial(name string) (*amqp.Connection, error) {
	return e.dialSocket(name, false)
}

// dialSocket is dial, with a socket that batches its writes if batched: the outbox
// publisher's own (batchedConn, generated from pkg/outbox/outboxrabbitmq).
func (e *env) dialSocket(name string, batched bool) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "bench-" + e.id + "-" + name},
	}
	if batched {
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(30*time.Second)(network, addr)
			if err != nil {
				return nil, err
			}
			return newBatchedConn(c), nil
		}
	}
	conn, err := amqp.DialConfig(e.cfg.AMQPURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	return conn, nil
}

// withChannel runs fn on a fresh channel of a fresh connection.
func (e *env) withChannel(fn func(*amqp.Channel) error) error {
	conn, err := e.dial("admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	return fn(ch)
}

// topology is a durable topic exchange and a durable classic queue bound to it with "#".
type topology struct {
	Exchange, Queue string
}

// declareTopology declares the run's exchange and queue for suffix and deletes them at the
// end of the run.
func (e *env) declareTopology(suffix string) (topology, error) {
	t := topology{Exchange: e.amqpName(suffix), Queue: e.amqpName(suffix + ".q")}
	err := e.withChannel(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
		}
		if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue %s: %w", t.Queue, err)
		}
		return ch.QueueBind(t.Queue, "#", t.Exchange, false, nil)
	})
	if err != nil {
		return topology{}, err
	}
	e.deleteLater([]string{t.Exchange}, []string{t.Queue})
	return t, nil
}

// deleteLater deletes exchanges and queues at the end of the run. Deleting one that does not
// exist is no error for RabbitMQ.
func (e *env) deleteLater(exchanges, queues []string) {
	e.later(func(context.Context) error {
		return e.withChannel(func(ch *amqp.Channel) error {
			for _, q := range queues {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					return fmt.Errorf("delete queue %s: %w", q, err)
				}
			}
			for _, x := range exchanges {
				if err := ch.ExchangeDelete(x, false, false); err != nil {
					return fmt.Errorf("delete exchange %s: %w", x, err)
				}
			}
			return nil
		})
	})
}

// sink keeps a queue from filling the broker while a phase publishes into it: it purges
// the queue at an interval and counts what it purged, so that Count is every message the
// queue received.
type sink struct {
	queue  string
	conn   *amqp.Connection
	mu     sync.Mutex // one RPC at a time on ch
	ch     *amqp.Channel
	purged int64
	stop   chan struct{}
	done   chan struct{}
}

func (e *env) startSink(queue string, every time.Duration) (*sink, error) {
	conn, err := e.dial("sink")
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	s := &sink{queue: queue, conn: conn, ch: ch, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				if err := s.purge(); err != nil {
					e.log.Warn("purge failed", "queue", queue, "error", err)
				}
			}
		}
	}()
	return s, nil
}

func (s *sink) purge() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.ch.QueuePurge(s.queue, false)
	s.purged += int64(n)
	return err
}

// Count returns how many messages the queue received since the sink started: those purged
// and those still in it.
func (s *sink) Count() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.ch.QueueDeclarePassive(s.queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", s.queue, err)
	}
	return s.purged + int64(q.Messages), nil
}

// waitFor polls Count until it reaches n or timeout passes, and returns the last count and
// when it reached n.
func (s *sink) waitFor(ctx context.Context, n int64, timeout time.Duration) (int64, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		got, err := s.Count()
		if err != nil || got >= n {
			return got, time.Now(), err
		}
		if time.Now().After(deadline) {
			return got, time.Time{}, fmt.Errorf("queue %s received %d of %d messages within %s", s.queue, got, n, timeout)
		}
		select {
		case <-ctx.Done():
			return got, time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close stops purging and empties the queue.
func (s *sink) Close() {
	close(s.stop)
	<-s.done
	_ = s.purge()
	_ = s.conn.Close()
}

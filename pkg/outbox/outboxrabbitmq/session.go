package outboxrabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one AMQP connection and what the publisher knows about it.
type session struct {
	conn   *amqp.Connection
	raw    net.Conn
	broker string // its name (brokers.names)

	mu            sync.Mutex
	blocked       bool
	blockedReason string
	changed       chan struct{} // poked (capacity 1) whenever blocked changes
	watched       chan struct{} // closed when the goroutine reading connection.blocked ended
}

// channel is one confirm-mode channel and its notifications.
type channel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
	// stale is set when confirms or returns may still arrive for an earlier batch: the next
	// batch starts on a new channel, so that they cannot be taken for its own.
	stale bool
}

// ensureChannel makes sure l.ch is an open, fresh confirm-mode channel, connecting if needed.
// It sends nothing while the broker blocks the connection.
//
// Each Publish call goes through it first: an explicit supervisor, not amqp091-go's own
// recovery, so that every reconnect is visible here and in [Hooks]. A channel the broker
// closed over one message is replaced by a new channel on the same connection: a message's
// fault never costs a reconnect.
func (l *lane) ensureChannel(ctx context.Context) error {
	if l.sess != nil && l.sess.conn.IsClosed() {
		_ = l.closeSession(time.Now(), errors.New("connection closed"))
	}
	if l.sess == nil {
		if err := l.connect(ctx); err != nil {
			l.setUp(false, err)
			return fmt.Errorf("connect: %w", err)
		}
		l.setUp(true, nil)
	}
	if reason, blocked := l.sess.isBlocked(); blocked {
		// It reads nothing from this connection until it unblocks it.
		return fmt.Errorf("the broker blocks the connection: %s", reason)
	}
	if l.ch != nil && (l.ch.stale || l.ch.ch.IsClosed()) {
		_ = l.ch.ch.Close() // an RPC (nothing to do if closed already): the guard bounds it
		l.ch = nil
	}
	if l.ch != nil {
		return nil
	}
	c, err := l.openChannel()
	if err != nil {
		if l.sess.conn.IsClosed() || l.guard.hasFired() {
			_ = l.closeSession(time.Now(), err)
		}
		return err
	}
	l.ch = c
	return nil
}

// connect dials the brokers in turn within ctx's deadline, each within DialTimeout.
func (l *lane) connect(ctx context.Context) error {
	var deadline time.Time
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(l.cfg.ConnectionName)
	var s *session
	conn, i, err := l.brokers.dial(deadline, l.cfg.DialTimeout, func() bool { return ctx.Err() != nil || l.guard.hasFired() },
		func(url string, tlsConf *tls.Config, deadline time.Time) (*amqp.Connection, error) {
			s = &session{changed: make(chan struct{}, 1), watched: make(chan struct{})}
			conn, err := amqp.DialConfig(url, amqp.Config{
				Heartbeat:       10 * time.Second,
				Properties:      props,
				TLSClientConfig: tlsConf,
				Dial: func(network, addr string) (net.Conn, error) {
					d := net.Dialer{Deadline: deadline}
					raw, err := d.DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					// The handshake's deadline; amqp091-go clears it once the connection is open.
					if err := raw.SetDeadline(deadline); err != nil {
						_ = raw.Close()
						return nil, err
					}
					// Writes go out in batches (batchedConn); closing it closes raw.
					conn := newBatchedConn(raw)
					s.raw = conn
					l.guard.use(conn)
					return conn, nil
				},
			})
			if err != nil && s.raw != nil {
				_ = s.raw.Close()
			}
			return conn, err
		})
	if err != nil {
		l.broker = ""
		return fmt.Errorf("dial: %w", err)
	}
	broker := l.brokers.names[i]
	l.broker = broker
	s.conn, s.broker = conn, broker
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go s.watchBlocked(blocks, l.cfg.Logger.With("connection_name", l.cfg.ConnectionName, "broker", broker))
	l.sess = s
	return nil
}

// watchBlocked follows connection.blocked and connection.unblocked until the connection
// closes.
func (s *session) watchBlocked(blocks <-chan amqp.Blocking, log *slog.Logger) {
	defer close(s.watched)
	for b := range blocks {
		s.mu.Lock()
		s.blocked, s.blockedReason = b.Active, b.Reason
		s.mu.Unlock()
		select {
		case s.changed <- struct{}{}:
		default:
		}
		if b.Active {
			log.Warn("rabbitmq publisher: the broker blocked the connection; nothing is sent until it unblocks it", "reason", b.Reason)
		} else {
			log.Info("rabbitmq publisher: the broker unblocked the connection")
		}
	}
}

func (s *session) isBlocked() (reason string, blocked bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blockedReason, s.blocked
}

func (l *lane) openChannel() (*channel, error) {
	ch, err := l.sess.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	if l.cfg.Setup != nil {
		if err := l.cfg.Setup(ch); err != nil {
			_ = ch.Close()
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	return &channel{
		ch: ch,
		// Buffered: the library drops a return it cannot hand over within a few seconds.
		returns: ch.NotifyReturn(make(chan amqp.Return, 1024)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// closeSession closes the connection, waiting for the broker's answer until deadline, and
// forgets it. cause is nil for a deliberate close.
func (l *lane) closeSession(deadline time.Time, cause error) error {
	s := l.sess
	l.sess, l.ch = nil, nil
	if s == nil {
		return nil
	}
	l.broker = s.broker
	var err error
	if time.Now().Before(deadline) {
		err = s.conn.CloseDeadline(deadline)
	}
	// However the close went, the socket goes: nothing may be left blocked on it.
	_ = s.raw.Close()
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	// The connection's shutdown ends the watcher; wait for it, so that no goroutine outlives
	// the connection (bounded: the socket is closed).
	select {
	case <-s.watched:
	case <-time.After(time.Second):
	}
	if l.up {
		l.setUp(false, cause)
	}
	return err
}

func (l *lane) setUp(up bool, cause error) {
	changed := up != l.up
	l.up = up
	if changed {
		attrs := []any{"connection_name", l.cfg.ConnectionName, "broker", l.broker}
		if l.cfg.Connections > 1 {
			attrs = append(attrs, "connection", l.id)
		}
		switch {
		case up:
			l.cfg.Logger.Info("rabbitmq publisher connected", attrs...)
		case cause == nil:
			l.cfg.Logger.Info("rabbitmq publisher closed its connection", attrs...)
		default:
			l.cfg.Logger.Warn("rabbitmq publisher disconnected", append(attrs, "error", cause)...)
		}
	}
	p := l.p
	p.hookMu.Lock()
	defer p.hookMu.Unlock() // also when the hook panics
	if changed && up {
		p.open++
	} else if changed {
		p.open--
	}
	if h := l.cfg.Hooks.Connected; h != nil && (changed || !up) {
		h(ConnectionChange{Up: up, Err: cause, Broker: l.broker, Connection: l.id, Open: p.open})
	}
}

package inboxrabbitmq

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

// dialTimeout bounds the TCP connect and the AMQP handshake of one connection attempt.
const dialTimeout = 15 * time.Second

// Consumer consumes a RabbitMQ queue into the inbox. Create it with [NewConsumer].
type Consumer struct {
	pool inbox.TxBeginner
	// lockTimed is pool for batches' transactions: see lockTimed.
	lockTimed inbox.TxBeginner
	store     *inbox.Store // of cfg.Tables
	cfg       Config
	log       *slog.Logger
	tracer    trace.Tracer
	brokers   *brokers

	running atomic.Bool
	// batches sizes the batches (BatchSize > 1).
	batches *batchSizer
	// held counts the deliveries held for an in-place retry.
	held atomic.Int64
	// holds is the failure streak of the deliveries held after transient failures, one per
	// Run; holdsMu makes a change of held and the streak's record of it one step (see
	// handle).
	holdsMu sync.Mutex
	holds   *retry.Streak
	// logInterval is the LogInterval of the consumer's failure streaks; 0 means
	// retry.DefaultLogInterval. Tests shorten it.
	logInterval time.Duration

	mu     sync.Mutex
	status Status // Running, Connected, Since, LastError, SetupWarning; Held comes from held
}

// Status is a snapshot of a consumer's state, for readiness checks and status pages.
type Status struct {
	// Running: Run is running. Connected: it consumes on a live broker connection.
	Running, Connected bool
	// Since is when Connected last changed (when Run started, for a consumer that never
	// connected); LastError is why it is not connected, nil while it is.
	Since     time.Time
	LastError error
	// Broker is the host:port (and vhost, unless "/") of the broker consumed from, or last
	// consumed from; empty until the first connection.
	Broker string
	// SetupWarning is the error [Config].Setup returned on the last connect that the
	// consumer tolerated; nil when Setup succeeded.
	SetupWarning error
	// Held is the number of deliveries held after transient failures.
	Held int
}

// NewConsumer returns a consumer of cfg ([Config.WithDefaults]) that processes each message
// with inbox.Process on pool. It does not connect; [Consumer.Run] does. It logs a warning
// when the pool is smaller than the consumer needs ([Consumer.PoolSize]).
func NewConsumer(pool inbox.TxBeginner, cfg Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("inbox: NewConsumer: pool is nil")
	}
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	store, err := inbox.NewStore(cfg.Tables) // cannot fail: WithDefaults checked the tables
	if err != nil {
		return nil, fmt.Errorf("inbox: invalid consumer config: %w", &fieldError{"tables", err})
	}
	cfg.Tables = store.Tables()
	b, _ := parseBrokers(cfg.URL, cfg.URLs, cfg.TLSClientConfig) // checked by WithDefaults
	c := &Consumer{
		pool:      pool,
		lockTimed: newLockTimed(pool),
		store:     store,
		cfg:       cfg,
		log:       cfg.Logger.With(slog.String("consumer", cfg.Name), slog.String("queue", cfg.Queue)),
		brokers:   b,
		batches:   newBatchSizer(cfg.BatchSize),
	}
	c.tracer = cfg.TracerProvider.Tracer(TracerName)
	if size := c.PoolSize(); size.Shortfall() > 0 {
		c.log.Warn("rabbitmq consumer: the pool is smaller than Concurrency; handlers will wait for connections",
			slog.Int("pool_max_conns", size.Max), slog.Int("connections_needed", size.Needed))
	}
	return c, nil
}

// PoolSize is what [Consumer.PoolSize] reports, as the outbox relay's does.
type PoolSize struct {
	// Needed is [Config].Concurrency; Max is the pool's largest size, read from its Stat
	// method (*pgxpool.Pool has one), or 0 when the pool does not tell.
	Needed, Max int
}

// Shortfall is how many connections the pool lacks for Needed: 0 when it is large enough
// or its size is unknown.
func (s PoolSize) Shortfall() int {
	if s.Max <= 0 {
		return 0
	}
	return max(0, s.Needed-s.Max)
}

// PoolSize reports the connections the consumer may hold at once, one per transaction, and
// the pool's size. A smaller pool works, more slowly: handlers wait for a connection, holding
// their deliveries (see the README's Sizing the pool).
func (c *Consumer) PoolSize() PoolSize {
	return PoolSize{Needed: c.cfg.Concurrency, Max: poolMax(c.pool)}
}

// Run consumes until ctx is done, then stops gracefully and returns nil; it returns an
// error only when it is already running. It connects, runs [Config].Setup, and consumes
// [Config].Queue with manual acknowledgements; when the broker goes away, it finishes the
// messages in hand and reconnects after the outage backoff ([Config].OutageBaseDelay).
// When ctx ends, it hands back the messages prefetched and those it holds, lets those being
// handled finish within [Config].ShutdownTimeout, and closes the connection. No goroutine
// outlives Run.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("inbox: consumer is already running")
	}
	defer c.running.Store(false)

	// The reconnect loop: the lost connection or the first failed attempt starts a streak;
	// the streak's backoff spaces the attempts and its lines are the loop's only warnings.
	reconnects := &retry.Streak{What: "rabbitmq consumer: broker connection", Logger: c.log, LogInterval: c.logInterval,
		Backoff: retry.Backoff{Base: c.cfg.OutageBaseDelay, Max: c.cfg.OutageMaxDelay}}
	// The handlers' goroutines read c.holds; they start after this.
	c.holds = &retry.Streak{What: "rabbitmq consumer: held deliveries", Logger: c.log, LogInterval: c.logInterval,
		Backoff: c.holdBackoff()}
	var (
		connected bool
		broker    string // of the connection consumed on, or last lost
		attempts  int    // failed connection attempts since the last connection
		downSince = time.Now()
	)
	c.setStatus(func(st *Status) { *st = Status{Running: true, Since: downSince} })
	defer c.setStatus(func(st *Status) {
		st.Running, st.Connected, st.Since, st.LastError = false, false, time.Now(), errors.New("the consumer stopped")
	})
	onConnected := func(name string) {
		reconnects.Succeed(ctx)
		c.log.InfoContext(ctx, "consuming", slog.String("broker", name))
		connected, broker, attempts = true, name, 0
		c.setStatus(func(st *Status) { st.Connected, st.Since, st.LastError, st.Broker = true, time.Now(), nil, name })
		c.hookConnected(true, nil, name)
	}
	for {
		err := c.session(ctx, onConnected)
		if ctx.Err() != nil {
			if connected {
				c.hookConnected(false, nil, broker)
			}
			c.log.InfoContext(ctx, "consumer stopped")
			return nil
		}
		cause := err
		if connected {
			downSince = time.Now()
			c.setStatus(func(st *Status) { st.Connected, st.Since, st.LastError = false, downSince, err })
			connected = false
			c.hookConnected(false, err, broker)
			cause = fmt.Errorf("lost the connection to %s: %w", broker, err)
		} else {
			c.setStatus(func(st *Status) { st.LastError = err })
			attempts++
			c.log.DebugContext(ctx, "connection attempt failed", slog.Int("attempt", attempts), slog.Any("error", err))
		}
		if !retry.Sleep(ctx, reconnects.Fail(ctx, cause)) {
			c.log.InfoContext(ctx, "consumer stopped")
			return nil
		}
	}
}

// session is one connection's life: connect, consume until ctx ends or the connection fails,
// then wind down. It calls onConnected once consuming.
func (c *Consumer) session(ctx context.Context, onConnected func(broker string)) error {
	l, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = l.conn.CloseDeadline(time.Now().Add(5 * time.Second)) }()
	onConnected(l.broker)

	// waitCtx ends on stop or connection loss and interrupts retry backoffs. workCtx
	// outlives ctx: handlers, commits and confirms in flight when ctx ends may finish, until
	// ShutdownTimeout.
	waitCtx, cancelWait := context.WithCancel(ctx)
	defer cancelWait()
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	s := &session{pub: l.pub, user: l.user, runCtx: ctx, waitCtx: waitCtx, workCtx: workCtx, cancelled: make(chan struct{}),
		acks: newAcker(l.ch, c.cfg.AckEvery, c.log)}

	workersDone := c.startWorkers(s, l.deliveries)
	var cancelling sync.WaitGroup
	result := c.awaitEnd(ctx, l, s, workersDone, &cancelling)
	if result != nil {
		s.acks.close() // the channel is gone: its delivery tags mean nothing any more
	}
	cancelWait()
	c.windDown(ctx, l.conn, workersDone, cancelWork)
	if result == nil && !l.conn.IsClosed() {
		s.acks.flush() // a stop: acknowledge what was processed before closing the channel
	}
	s.acks.close()
	_ = l.conn.CloseDeadline(time.Now().Add(5 * time.Second))
	cancelling.Wait()
	return result
}

// link is a connection set up for consuming: a channel consuming the queue with the
// prefetch set, and the publisher of the same connection.
type link struct {
	conn *amqp.Connection
	// broker names the broker connected to, for logs and hooks; user is the connection's
	// login, the only user-id property the broker lets it publish.
	broker, user string
	ch           *amqp.Channel
	// connClosed and chClosed receive the close of the connection and of ch.
	connClosed, chClosed chan *amqp.Error
	pub                  *publisher
	// tag is the consumer tag of the subscription, deliveries its delivery channel.
	tag        string
	deliveries <-chan amqp.Delivery
}

// connect dials the brokers in turn until one answers and sets up consuming on its
// connection. When the set-up fails it closes the connection.
func (c *Consumer) connect(ctx context.Context) (*link, error) {
	conn, i, err := c.brokers.dial(time.Time{}, dialTimeout, func() bool { return ctx.Err() != nil },
		func(url string, tlsConf *tls.Config, deadline time.Time) (*amqp.Connection, error) {
			return c.dial(ctx, url, tlsConf, deadline)
		})
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	uri, _ := amqp.ParseURI(c.brokers.urls[i]) // checked by WithDefaults
	l := &link{conn: conn, broker: c.brokers.names[i], user: uri.Username, connClosed: conn.NotifyClose(make(chan *amqp.Error, 1))}
	if err := c.consume(ctx, l); err != nil {
		_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
		return nil, err
	}
	return l, nil
}

// consume opens l's channel, runs Setup on it, sets the prefetch, opens the publisher and
// subscribes to the queue.
func (c *Consumer) consume(ctx context.Context, l *link) error {
	var err error
	if l.ch, err = l.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	l.chClosed = l.ch.NotifyClose(make(chan *amqp.Error, 1))
	if c.cfg.Setup != nil {
		if l.ch, l.chClosed, err = c.setup(ctx, l.conn, l.ch, l.chClosed); err != nil {
			return err
		}
	}
	if err := l.ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	// The publisher's channel closes with the connection.
	l.pub = &publisher{conn: l.conn, timeout: c.cfg.PublishTimeout}
	if err := l.pub.open(); err != nil {
		return err
	}
	l.tag = consumerTag(c.cfg.Name)
	if l.deliveries, err = l.ch.Consume(c.cfg.Queue, l.tag, false, false, false, false, nil); err != nil {
		return fmt.Errorf("consume %q: %w", c.cfg.Queue, err)
	}
	return nil
}

// startWorkers starts Concurrency workers on deliveries and returns a channel closed once
// they all returned, which they do when the delivery channel closes.
func (c *Consumer) startWorkers(s *session, deliveries <-chan amqp.Delivery) <-chan struct{} {
	// Stamp each delivery with its arrival: a delivery's hold is bounded from when the
	// broker handed it over (its consumer_timeout clock), not from when a worker took it.
	// At most Prefetch deliveries are unacknowledged, so the buffer never fills; the
	// goroutine ends when the delivery channel closes, which happens before workersDone.
	arrived := make(chan inbound, c.cfg.Prefetch)
	go func() {
		defer close(arrived)
		for d := range deliveries {
			s.acks.received(d.DeliveryTag) // before any worker can settle it: see acker
			arrived <- inbound{Delivery: d, at: time.Now()}
		}
	}()
	var workers sync.WaitGroup
	for range c.cfg.Concurrency {
		workers.Go(func() { c.work(s, arrived) })
	}
	workersDone := make(chan struct{})
	go func() {
		workers.Wait()
		s.solos.Wait() // only workers start solos
		close(workersDone)
	}()
	return workersDone
}

// awaitEnd waits for the end of the session: ctx ending (a stop), the connection or the
// channel closing, or the broker ending the subscription, which closes the delivery channel
// and so ends the workers. It closes s.cancelled once the subscription is over, and returns
// why the session ended, nil for a stop.
//
// On a stop it asks the broker to end the subscription. Cancel is an RPC: it runs in a
// goroutine that cancelling tracks, so that a silent broker cannot hold up the shutdown
// beyond ShutdownTimeout (closing the connection ends it). The delivery channel closes once
// the workers have handed back what was prefetched.
func (c *Consumer) awaitEnd(ctx context.Context, l *link, s *session, workersDone <-chan struct{}, cancelling *sync.WaitGroup) error {
	select {
	case <-ctx.Done():
		s.stopping.Store(true)
		cancelling.Go(func() {
			defer close(s.cancelled)
			if err := l.ch.Cancel(l.tag, false); err != nil {
				c.log.DebugContext(ctx, "cancel subscription failed", slog.Any("error", err))
			}
		})
		return nil
	case amqpErr := <-l.connClosed:
		close(s.cancelled) // the subscription ended with the connection
		return fmt.Errorf("connection closed: %w", closeErr(amqpErr))
	case amqpErr := <-l.chClosed:
		close(s.cancelled)
		return fmt.Errorf("channel closed: %w", closeErr(amqpErr))
	case <-workersDone:
		close(s.cancelled)
		return errors.New("the broker cancelled the consumer (queue deleted?)")
	}
}

// windDown gives the messages in hand ShutdownTimeout to finish. Then it cancels their work
// (their transactions roll back) and closes the connection, which closes the delivery
// channel and hands every unacknowledged message back to the broker, and waits for the
// workers.
func (c *Consumer) windDown(ctx context.Context, conn *amqp.Connection, workersDone <-chan struct{}, cancelWork context.CancelFunc) {
	timer := time.NewTimer(c.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-workersDone:
	case <-timer.C:
		c.log.WarnContext(ctx, "messages in hand did not finish in time; cancelling them",
			slog.Duration("shutdown_timeout", c.cfg.ShutdownTimeout))
		cancelWork()
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		<-workersDone
	}
}

// session is the state shared by the workers of one connection.
type session struct {
	pub *publisher
	// user is the login of the connection, the only user-id property the broker lets it
	// publish.
	user string
	// runCtx is Run's: it ends when the consumer is asked to stop. waitCtx ends with it or
	// when the connection is lost; workCtx ends ShutdownTimeout after either.
	runCtx  context.Context
	waitCtx context.Context
	workCtx context.Context
	// stopping is set when the session saw Run's context end; cancelled is closed once the
	// broker confirmed the end of the subscription (or the attempt failed, or the
	// subscription ended with its channel).
	stopping  atomic.Bool
	cancelled chan struct{}
	// acks settles the deliveries of the session's channel.
	acks *acker
	// solos are the messages of batches that go on alone (see handleBatch).
	solos sync.WaitGroup
}

// inbound is a delivery and when it arrived.
type inbound struct {
	amqp.Delivery
	at time.Time
}

// stopped reports whether the session ended, by a stop (Run's context) or a lost connection.
func (s *session) stopped() bool { return s.waitCtx.Err() != nil }

// stopRequested reports whether Run's context ended. It may be true before stopping is set.
func (s *session) stopRequested() bool { return s.runCtx.Err() != nil }

// work handles deliveries until the delivery channel closes.
func (c *Consumer) work(s *session, deliveries <-chan inbound) {
	for d := range deliveries {
		if s.stopping.Load() {
			// Stopping: hand prefetched messages back at once, for other consumers; after the
			// subscription ended, or the broker would deliver them right back to us. This
			// costs each a delivery on a quorum queue, as a crash would; republishing them
			// instead would move every prefetched message behind the queue on every
			// restart.
			<-s.cancelled
			_ = s.acks.nack(d.DeliveryTag)
			c.hookHandedBack(d.Type, HandBackRequeued)
			continue
		}
		if c.cfg.BatchSize > 1 {
			c.handleBatch(s, c.gather(s, d, deliveries))
			continue
		}
		c.handle(s, d)
	}
}

// setup runs Config.Setup on ch. It tolerates an "inequivalent arg" PRECONDITION_FAILED (a
// queue or exchange that exists with other arguments): it warns, opens a new channel (the
// error closed ch) and checks that the queue to consume exists. It returns the channel to
// consume on and its close notifications.
func (c *Consumer) setup(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel, chClosed chan *amqp.Error) (*amqp.Channel, chan *amqp.Error, error) {
	err := c.cfg.Setup(ch)
	if err == nil {
		c.setStatus(func(st *Status) { st.SetupWarning = nil })
		return ch, chClosed, nil
	}
	amqpErr, ok := errors.AsType[*amqp.Error](err)
	if !ok || amqpErr.Code != amqp.PreconditionFailed || !strings.Contains(amqpErr.Reason, "inequivalent arg") {
		return nil, nil, fmt.Errorf("setup: %w", err)
	}
	ch, err2 := conn.Channel()
	if err2 != nil {
		return nil, nil, fmt.Errorf("open channel after setup failed (%v): %w", err, err2)
	}
	chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	if _, err2 := ch.QueueDeclarePassive(c.cfg.Queue, false, false, false, false, nil); err2 != nil {
		return nil, nil, fmt.Errorf("setup: %w; and the queue cannot be consumed as it is: %w", err, err2)
	}
	var first bool
	c.setStatus(func(st *Status) {
		first = st.SetupWarning == nil || st.SetupWarning.Error() != err.Error()
		st.SetupWarning = err
	})
	level := slog.LevelDebug
	if first {
		level = slog.LevelWarn
	}
	c.log.Log(ctx, level, "topology exists with other arguments than Setup declares; consuming the existing queue as it is "+
		"(declarations after the failed one were skipped; change queue arguments through a policy, or recreate the queue)",
		slog.Any("error", err))
	return ch, chClosed, nil
}

// Status returns the consumer's state.
func (c *Consumer) Status() Status {
	c.mu.Lock()
	st := c.status
	c.mu.Unlock()
	st.Held = int(c.held.Load())
	return st
}

// Connected reports whether the consumer is consuming on a live broker connection.
func (c *Consumer) Connected() bool { return c.Status().Connected }

// Ready returns nil while the consumer runs and is connected to the broker, or has been
// disconnected for at most maxUnavailable (a reconnect takes a second or two). Otherwise it
// returns an error that says what is down, since when, and the last error. It does not look
// at the database: a consumer whose database is unreachable holds its deliveries
// ([Status].Held) and loses nothing.
func (c *Consumer) Ready(maxUnavailable time.Duration) error {
	st := c.Status()
	switch {
	case !st.Running:
		return errors.New("inbox: consumer not running")
	case st.Connected:
		return nil
	}
	down := time.Since(st.Since)
	if down <= maxUnavailable {
		return nil
	}
	msg := fmt.Sprintf("inbox: consumer not connected to the broker for %s (since %s)",
		down.Round(time.Second), st.Since.UTC().Format(time.RFC3339))
	if st.LastError != nil {
		return fmt.Errorf("%s: %w", msg, st.LastError)
	}
	return errors.New(msg)
}

func (c *Consumer) setStatus(change func(*Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	change(&c.status)
}

// dial connects to one broker, with tlsConf for an amqps:// one, giving up at deadline.
func (c *Consumer) dial(ctx context.Context, url string, tlsConf *tls.Config, deadline time.Time) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxshop inbox " + c.cfg.Name)
	return amqp.DialConfig(url, amqp.Config{
		Properties:      props,
		TLSClientConfig: tlsConf,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Deadline: deadline}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the handshake; the library clears the deadline once connected.
			if err := conn.SetDeadline(deadline); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		},
	})
}

// closeErr turns a close notification into an error; a nil *amqp.Error (a clean close)
// would otherwise become a non-nil error interface holding nil.
func closeErr(err *amqp.Error) error {
	if err == nil {
		return amqp.ErrClosed
	}
	return err
}

// consumerTag is the name, followed by a random suffix, so the consumer is recognisable in
// the broker's listings.
func consumerTag(name string) string {
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	if len(name) > 200 {
		name = name[:200]
	}
	return name + "-" + hex.EncodeToString(b)
}

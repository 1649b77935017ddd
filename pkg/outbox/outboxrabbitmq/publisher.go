package outboxrabbitmq

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

var (
	// ErrUnroutable is outbox.ErrUnroutable: the broker returned the message, no queue bound.
	ErrUnroutable = outbox.ErrUnroutable
	// ErrNacked: the broker refused the message for a reason of its own, never its content (a
	// full queue with reject-publish, a quorum queue without a quorum, an internal error); so
	// errors wrapping it also wrap outbox.ErrRefused, and the relay counts no attempt.
	ErrNacked = errors.New("outbox: nacked by the broker")
)

// errNacked is what a nacked message gets: both sentinels, so that errors.Is finds either,
// with ErrNacked's text alone (both say "outbox: ").
var errNacked error = nackError{}

type nackError struct{}

func (nackError) Error() string   { return ErrNacked.Error() }
func (nackError) Unwrap() []error { return []error{ErrNacked, outbox.ErrRefused} }

var (
	_ outbox.ConcurrentPublisher  = (*Publisher)(nil)
	_ outbox.MessagingSystemNamer = (*Publisher)(nil)
)

// Defaults and limits of [Config]: each field says what they mean.
const (
	DefaultConnectionName = "outbox-relay"
	DefaultDialTimeout    = 5 * time.Second
	MaxConnections        = outbox.MaxInFlightBatches
)

// Config configures a [Publisher]. The zero value of every field but URL or URLs means its
// default; [Config.WithDefaults] returns what the publisher will use.
type Config struct {
	// URL is the broker, e.g. amqp://guest:guest@localhost:5672/. Set URL or URLs, not
	// both.
	URL string
	// URLs are the nodes of a cluster, one URL each. Set URL or URLs, not both. They are
	// tried round-robin from a random start; one connect tries each at most once, within
	// DialTimeout and an equal share of the deadline left (README.md#several-brokers).
	URLs []string
	// TLSClientConfig is the TLS configuration of the amqps:// URLs, for what a URL cannot
	// say: a private CA (RootCAs) rather than the system's roots, a client certificate, a
	// minimum version. Each connection gets a clone whose ServerName is its URL's host,
	// unless one is set. With it, every URL must be amqps:// and carry no TLS parameters of
	// its own (cacertfile, certfile, keyfile, server_name_indication); without it, an
	// amqps:// URL is checked against the system's roots, or the files its parameters name
	// (README.md#tls).
	TLSClientConfig *tls.Config
	// ConnectionName shows in the management UI. Default "outbox-relay"
	// ([DefaultConnectionName]).
	ConnectionName string
	// DialTimeout bounds connecting to one broker (within the caller's deadline), and closing
	// a connection in [Publisher.Close]. Default 5s ([DefaultDialTimeout]).
	DialTimeout time.Duration
	// Connections is how many Publish calls the publisher serves at once, each on an AMQP
	// connection of its own; a caller beyond them waits for a free connection until its
	// deadline. Give it the relay's outbox.Config.InFlightBatches
	// (README.md#batches-in-flight). Default 1, at most 16 ([MaxConnections]).
	Connections int
	// MaxMessageBytes is the broker's max_message_size, when known: a larger body is
	// outbox.Permanent wrapping outbox.ErrTooLarge, never sent. 0 (the default) checks
	// nothing here; the publisher then finds such a message when the broker closes the
	// channel over it, at the cost of a few round trips.
	MaxMessageBytes int
	// Setup runs on every new channel, before the first publish: declare the exchanges the
	// outbox publishes to there, so a restarted broker without them is repaired. Optional.
	Setup func(ch *amqp.Channel) error
	// Logger receives connection changes. nil discards.
	Logger *slog.Logger
	// Hooks observe the connection.
	Hooks Hooks
}

// Hooks are optional callbacks, for metrics and tests, called as outbox.Hooks are:
// concurrently, so safe for concurrent use, and fast. A hook runs inside the Publish or Close
// that saw the change, holding one of the publisher's connections: a slow one holds up that
// call's batch, a panic goes on in its caller, and it must not call the Publisher (a Close
// from a hook waits for itself for ever).
type Hooks struct {
	// Connected is called with Up true after every successful (re)connect, and with Up false
	// when a connection is lost or closed, or a dial fails.
	Connected func(ConnectionChange)
}

// ConnectionChange is passed to [Hooks].Connected.
type ConnectionChange struct {
	// Up is true when the connection came up, false when it went down or failed to open.
	Up bool
	// Connection is which of the publisher's [Config].Connections changed, from 0.
	Connection int
	// Open is how many of the publisher's connections are open after this change: the
	// publisher can send while it is above 0.
	Open int
	// Err is why the connection went down or could not be opened; nil when it came up or
	// was closed by [Publisher.Close].
	Err error
	// Broker is the host:port (and vhost, unless "/") of the broker, never the credentials;
	// empty when no broker could be reached.
	Broker string
}

// Publisher publishes batches of outbox messages, each on one channel. It is safe for
// concurrent use, serving up to [Config].Connections batches at once.
type Publisher struct {
	cfg     Config
	brokers *brokers
	lanes   []*lane
	// free holds the lanes no Publish or Close is using: a channel rather than a mutex, so
	// that a caller can stop waiting when its deadline passes.
	free chan *lane

	// hookMu orders the lanes' connection changes: open and the Connected hook's calls.
	hookMu sync.Mutex
	open   int
}

// lane is one connection of a Publisher, with its channel: the holder of the lane (taken
// from Publisher.free) owns every field but guard's.
//
// A connection each, not a channel each: amqp091-go writes every frame of a connection under
// one lock, and a call whose deadline passes closes its socket, which on a shared connection
// would fail the other calls' batches too. So a connection that hangs or is lost costs only
// the batch on it, and each reconnects on its own.
type lane struct {
	p       *Publisher
	id      int
	cfg     *Config
	brokers *brokers
	// guard closes the socket in use when the current caller's deadline passes.
	guard guard

	sess *session
	ch   *channel
	up   bool
	// broker names the broker of the current connection, or of the last one tried.
	broker string
}

// WithDefaults returns c with every default filled in, as a publisher given c runs with, or
// an error listing every invalid field. [New] calls it.
func (c Config) WithDefaults() (Config, error) {
	_, err := c.check()
	return c.filled(), err
}

// check reports every invalid field of c, and returns the brokers of its URLs.
func (c Config) check() (*brokers, error) {
	b, errs := parseBrokers(c.URL, c.URLs, c.TLSClientConfig)
	if c.Connections < 0 || c.Connections > MaxConnections {
		errs = append(errs, fmt.Errorf("connections must be between 0 (default 1) and %d, got %d", MaxConnections, c.Connections))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max message bytes must be >= 0 (0 checks nothing), got %d", c.MaxMessageBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outbox: invalid rabbitmq publisher config: %w", err)
	}
	return b, nil
}

// filled is c with its defaults filled in.
func (c Config) filled() Config {
	c.ConnectionName = cmp.Or(c.ConnectionName, DefaultConnectionName)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Connections = max(c.Connections, 1)
	c.URLs = slices.Clone(c.URLs)
	return c
}

// New returns a Publisher. It does not connect: the first Publish does.
func New(cfg Config) (*Publisher, error) {
	b, err := cfg.check()
	if err != nil {
		return nil, err
	}
	cfg = cfg.filled()
	p := &Publisher{cfg: cfg, brokers: b, free: make(chan *lane, cfg.Connections)}
	for i := range cfg.Connections {
		l := &lane{p: p, id: i, cfg: &p.cfg, brokers: b}
		p.lanes = append(p.lanes, l)
		p.free <- l
	}
	return p, nil
}

// Close closes the connections, each after the Publish under way on it, if any, returned. A
// later Publish connects again.
func (p *Publisher) Close() error {
	taken := make([]*lane, 0, len(p.lanes))
	for range p.lanes {
		taken = append(taken, <-p.free)
	}
	var errs []error
	for _, l := range taken {
		errs = append(errs, l.closeSession(time.Now().Add(p.cfg.DialTimeout), nil))
	}
	for _, l := range taken {
		p.free <- l
	}
	return errors.Join(errs...)
}

// ConcurrentPublishes returns [Config].Connections: how many Publish calls the publisher
// serves at once (outbox.ConcurrentPublisher).
func (p *Publisher) ConcurrentPublishes() int { return len(p.lanes) }

// MessagingSystem returns "rabbitmq", the messaging.system attribute of the relay's publish
// spans (outbox.MessagingSystemNamer).
func (p *Publisher) MessagingSystem() string { return "rabbitmq" }

// Publish sends msgs and waits for their confirms. It returns one error per message, and
// blames every failure on exactly one thing, the message, the broker, or neither:
//
//   - ack, and no basic.return: nil, published;
//   - basic.return (routed to no queue): wraps [ErrUnroutable], an attempt counted;
//   - nack: wraps [ErrNacked], no attempt counted; the next batch goes out on a new channel;
//   - a message the broker would refuse by closing the channel or the connection (a row
//     written by hand or by older code) is never sent: outbox.Permanent with the cause. It
//     fails outbox.Message.Validate (but for the body's JSON syntax, and the aggregate_type
//     and aggregate_id headers, which the publisher overwrites), its content header would
//     not fit the negotiated frame size, or its body is over [Config].MaxMessageBytes;
//   - the broker closed the channel without naming the message (a body over its
//     max_message_size, an exchange that does not exist, a header it cannot accept): the
//     unconfirmed messages are republished one at a time on fresh channels, within the same
//     deadline, to find the refused ones: outbox.Permanent for a 406 PRECONDITION_FAILED, a
//     plain error otherwise (404 NOT_FOUND: the exchange may be declared later). The others
//     are published, or outbox.ErrNotSent if the deadline passes first; one sent before the
//     refused one may be published twice;
//   - no confirm before the deadline, the connection lost, or blocked by a resource alarm
//     (connection.blocked: answered at once, nothing sent): outbox.ErrUnavailable;
//   - the deadline passed while other calls had every connection: outbox.ErrNotSent.
//
// The deadline of ctx bounds every step, the wait for a free connection, dialling,
// [Config].Setup and socket writes included: when it passes mid-call, the publisher closes
// the socket, and the next call connects again.
//
// Messages are persistent, mandatory, and carry the outbox id as message-id, the event type,
// the creation time as timestamp, content type application/json, the correlation id, and the
// outbox headers plus aggregate_type and aggregate_id.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	send := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := validate(msgs[i], p.cfg.MaxMessageBytes); err != nil {
			errs[i] = err
			continue
		}
		send = append(send, i)
	}
	if len(send) == 0 {
		return errs
	}

	l := p.takeLane(ctx)
	if l == nil {
		fill(errs, send, fmt.Errorf("%w: the deadline passed while other batches had every connection of the publisher: %v", outbox.ErrNotSent, ctx.Err()))
		return errs
	}
	defer func() { p.free <- l }()
	return l.publish(ctx, msgs, send, errs)
}

// takeLane waits for a free lane until ctx ends; nil if none came in time.
func (p *Publisher) takeLane(ctx context.Context) *lane {
	if ctx.Err() != nil {
		return nil
	}
	var l *lane
	select {
	case l = <-p.free:
	case <-ctx.Done():
		return nil
	}
	if ctx.Err() != nil { // both were ready, and select took the lane
		p.free <- l
		return nil
	}
	return l
}

// publish sends msgs[send] on the lane; errs already holds the others' outcomes.
func (l *lane) publish(ctx context.Context, msgs []outbox.Message, send []int, errs []error) []error {
	// amqp091-go writes to the socket without a deadline, so a broker that stops reading
	// would hold a write for ever: the guard closes the socket when ctx's deadline passes,
	// which ends every blocked step at once. The search for a refused message (isolate) stops
	// a little before the deadline, so that running out of time there costs no reconnect.
	disarm := l.guard.arm(ctx)
	var hung bool // the broker left confirms owed until the deadline
	defer func() {
		if disarm() || hung {
			// The deadline closed the socket mid-call, or passed with confirms owed: a
			// broker that does not answer holds this connection (a channel.close on it
			// would hang too), so the next call starts on a new one.
			_ = l.closeSession(time.Now(), fmt.Errorf("publish deadline: %w", ctx.Err()))
		}
	}()

	if err := l.ensureChannel(ctx); err != nil {
		fill(errs, send, unavailable(ctx, err))
		return errs
	}
	send = fitting(msgs, send, l.sess.conn.Config.FrameSize, errs)
	if len(send) == 0 {
		return errs
	}

	a := l.attempt(ctx, msgs, send, errs)
	hung = a.timedOut
	switch {
	case len(a.unsettled) == 0:
	case a.isolate():
		l.isolate(ctx, msgs, a.unsettled, errs, a.closeErr)
	default:
		fill(errs, a.unsettled, a.unavailable)
	}
	return errs
}

// unavailable wraps a failure to get a channel.
func unavailable(ctx context.Context, err error) error {
	// err stays in the chain: a caller can tell a certificate the client refused
	// (x509.UnknownAuthorityError, x509.HostnameError) from a broker that is not there.
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w (deadline: %v)", outbox.ErrUnavailable, err, ctx.Err())
	}
	return fmt.Errorf("%w: %w", outbox.ErrUnavailable, err)
}

// fill sets errs[i] to err for every i of idx.
func fill(errs []error, idx []int, err error) {
	for _, i := range idx {
		errs[i] = err
	}
}

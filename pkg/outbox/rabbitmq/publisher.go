package rabbitmq

import (
	"cmp"
	"context"
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
	// ErrUnroutable: the broker returned the message because no queue is bound for it. It is
	// outbox.ErrUnroutable, so that broker-neutral code (metrics) recognises it.
	ErrUnroutable = outbox.ErrUnroutable
	// ErrNacked: the broker refused the message for a reason of its own. RabbitMQ nacks a
	// publish over a full queue with overflow reject-publish, a quorum queue without a
	// quorum, or an internal error, never over the message's content; so errors wrapping it
	// also wrap outbox.ErrRefused, for which the relay counts no attempt.
	ErrNacked = errors.New("nacked by broker")
)

// errNacked is what a nacked message gets: both sentinels, so that errors.Is finds either.
var errNacked = fmt.Errorf("%w (%w)", ErrNacked, outbox.ErrRefused)

var _ outbox.ConcurrentPublisher = (*Publisher)(nil)

// Defaults for [Config].
const (
	DefaultConnectionName = "outbox-relay"
	DefaultDialTimeout    = 5 * time.Second
	// MaxConnections is the largest [Config].Connections: as many as a relay has batches in
	// flight at most (outbox.MaxInFlightBatches).
	MaxConnections = outbox.MaxInFlightBatches
)

// Config configures a [Publisher].
type Config struct {
	// URL is the broker, e.g. amqp://guest:guest@localhost:5672/. Set URL or URLs, not
	// both.
	URL string
	// URLs are the nodes of a cluster, one URL each. Set URL or URLs, not both.
	//
	// They are tried round-robin from a random start: the first connection goes to a random
	// node, so that relays given the same list spread over the cluster; after a failed dial or
	// a lost connection, the next attempt takes the next URL in the list, so that a dead node
	// costs one refused dial and every other node is tried before it again. One connect tries
	// each URL at most once, each within DialTimeout and an equal share of the deadline left,
	// so that a node that accepts connections but does not answer (a paused one) cannot use
	// up the call. There is no backoff here: the relay's own backoff spaces the calls that
	// find no broker.
	URLs []string
	// ConnectionName shows in the management UI. Default "outbox-relay"
	// ([DefaultConnectionName]).
	ConnectionName string
	// DialTimeout bounds connecting to one broker (within the caller's deadline), and closing
	// a connection in [Publisher.Close]. Default 5s ([DefaultDialTimeout]).
	DialTimeout time.Duration
	// Connections is how many Publish calls the publisher serves at once, each on an AMQP
	// connection of its own, with its own channel, confirms and deadline; a caller beyond
	// them waits for a free connection, and gives up when its deadline passes first. Give it
	// the relay's outbox.Config.InFlightBatches, so that a relay sends its next batch while
	// the confirms of the one before are still coming, and the broker is never idle between
	// batches. Default 1: batches are sent one after the other. At most [MaxConnections].
	//
	// A connection each, not a channel each: amqp091-go writes every frame of a connection
	// under one lock, and a call whose deadline passes closes its socket (see
	// [Publisher.Publish]), which on a shared connection would fail the other calls' batches
	// too. So a connection that hangs or is lost costs only the batch on it; the others go on,
	// and each connection reconnects on its own. A resource alarm blocks every connection
	// that publishes, so each call finds its own connection blocked and returns
	// outbox.ErrUnavailable.
	Connections int
	// MaxBodyBytes is the broker's max_message_size, when known: a larger body is reported
	// as outbox.Permanent wrapping outbox.ErrTooLarge and never sent. 0 (the default) checks
	// nothing here; RabbitMQ then refuses such a message by closing the channel, and the
	// publisher finds and charges it all the same, at the cost of a few round trips.
	MaxBodyBytes int
	// Setup runs on every new channel, before the first publish: declare the exchanges the
	// outbox publishes to there, so a restarted broker without them is repaired. Optional.
	Setup func(ch *amqp.Channel) error
	// Logger receives connection changes. nil discards.
	Logger *slog.Logger
	// Hooks observe the connection.
	Hooks Hooks
}

// Hooks are optional callbacks for metrics. They are called inside the Publish or Close that
// saw the change, while it holds one of the publisher's connections, one call at a time: a
// hook must return quickly and must not call the Publisher (a Close from a hook waits for
// itself for ever). A hook's panic goes on in
// the caller of Publish (the relay's Run). Each takes one event struct, so that an event can
// gain fields without breaking a hook (the inbox consumer's hooks have the same shape).
type Hooks struct {
	// Connected is called with Up true after every successful (re)connect, and with Up false
	// when a connection is lost or closed, or a dial fails.
	Connected func(ConnectionChange)
}

// ConnectionChange is passed to [Hooks].Connected.
type ConnectionChange struct {
	// Up is true when the connection came up, false when it went down or could not be
	// opened.
	Up bool
	// Connection is which of the publisher's [Config].Connections changed, from 0.
	Connection int
	// Open is how many of the publisher's connections are open after this change: the
	// publisher can send while it is above 0.
	Open int
	// Err is why the connection went down or could not be opened; nil when it came up or
	// was closed by [Publisher.Close].
	Err error
	// Broker is the host:port (and vhost, unless "/") of the broker connected to, or of the
	// one whose connection went down; empty when no broker could be reached. Never the
	// credentials.
	Broker string
}

// Publisher publishes batches of outbox messages, each on one channel. It is safe for
// concurrent use: it serves up to [Config].Connections batches at once, each on a connection
// of its own, and a caller waits for a free connection only until its context's deadline.
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

// New returns a Publisher. It does not connect: the first Publish does.
func New(cfg Config) (*Publisher, error) {
	b, errs := parseBrokers(cfg.URL, cfg.URLs)
	if cfg.Connections < 0 || cfg.Connections > MaxConnections {
		errs = append(errs, fmt.Errorf("connections must be between 0 (default 1) and %d, got %d", MaxConnections, cfg.Connections))
	}
	if cfg.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes must be >= 0 (0 checks nothing), got %d", cfg.MaxBodyBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid publisher config: %w", err)
	}
	cfg.ConnectionName = cmp.Or(cfg.ConnectionName, DefaultConnectionName)
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, DefaultDialTimeout)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Connections = max(cfg.Connections, 1)
	cfg.URLs = slices.Clone(cfg.URLs)
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
// serves at once (see outbox.ConcurrentPublisher). With one (the default) the relay uses it
// one batch at a time.
func (p *Publisher) ConcurrentPublishes() int { return len(p.lanes) }

// MessagingSystem returns "rabbitmq", the messaging.system attribute of the relay's publish
// spans (see outbox.Config.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "rabbitmq" }

// Publish sends msgs and waits for their confirms. It returns one error per message, and
// blames every failure on exactly one thing, the message, the broker, or neither:
//
//   - ack, and no basic.return: published (nil);
//   - basic.return (mandatory, routed to no queue): an error wrapping [ErrUnroutable]; the
//     relay counts an attempt;
//   - nack: an error wrapping [ErrNacked], which says why no attempt is counted. The next
//     batch goes out on a new channel;
//   - a message that fails outbox.Message.Validate (but for the body's JSON syntax, which
//     the broker does not read and a json column cannot get wrong, and for headers named
//     aggregate_type or aggregate_id, which older code could store and the publisher
//     overwrites with the aggregate's, as it always did), whose content header would not fit
//     in the frame size negotiated with the broker, or whose body is over
//     [Config].MaxBodyBytes: outbox.Permanent with the cause, and it is never sent. These are
//     rows written by hand or by older code: the broker would close the channel or the whole
//     connection over them, which would look like an outage;
//   - the broker closed the channel without saying which message it objects to (RabbitMQ
//     names none: a body over its max_message_size, an exchange that does not exist, a
//     header it cannot accept): the publisher republishes the unconfirmed messages one at a
//     time on fresh channels of the same connection, within the same deadline, until it
//     finds the ones the broker refuses. Each of those is charged: outbox.Permanent for a
//     refusal of its content (406 PRECONDITION_FAILED: invalid message, message size), a
//     plain error otherwise (404 NOT_FOUND: the exchange may be declared later). The others
//     are published, or outbox.ErrNotSent if the deadline passed first. A message sent
//     before the refused one may have reached its queue without its confirm (the channel
//     closed first): it is published again, at least once as always;
//   - no confirm before the deadline, the connection lost, or the connection blocked by the
//     broker (connection.blocked: a memory or disk alarm): outbox.ErrUnavailable. Such a
//     message is never reported as published. While the broker blocks the connection,
//     Publish returns outbox.ErrUnavailable at once without sending anything;
//   - the deadline passed while other calls had every connection of the publisher:
//     outbox.ErrNotSent, and nothing was sent.
//
// The deadline of ctx bounds every step: the wait for a free connection (see
// [Config].Connections), dialling and the AMQP handshake, opening a channel and running
// [Config].Setup, socket writes, and the confirms. amqp091-go writes to the socket
// synchronously and without a deadline, so a broker that stops reading (a resource alarm, a
// black-holed network) would hold a write for ever: when the deadline passes with the call
// still under way, the publisher closes the connection's socket, which ends every blocked
// step at once, and the next call connects again. Publish returns within the deadline plus
// the moment it takes to close a socket. The search for a refused message (above) stops a
// little before the deadline, so that running out of time there costs no reconnect.
//
// Messages are persistent, mandatory, and carry the outbox id as message-id, the event type,
// the creation time as timestamp, content type application/json, the correlation id, and the
// outbox headers plus aggregate_type and aggregate_id.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	send := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := validate(msgs[i], p.cfg.MaxBodyBytes); err != nil {
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
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v (deadline: %v)", outbox.ErrUnavailable, err, ctx.Err())
	}
	return fmt.Errorf("%w: %v", outbox.ErrUnavailable, err)
}

// fill sets errs[i] to err for every i of idx.
func fill(errs []error, idx []int, err error) {
	for _, i := range idx {
		errs[i] = err
	}
}

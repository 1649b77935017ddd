// Package rabbitmq publishes outbox messages to RabbitMQ with publisher confirms.
//
// [Publisher] implements outbox.Publisher. A batch goes out on one confirm-mode channel with
// every message in flight at once, and each message's fate is read from its own confirm. Every
// failure is blamed on exactly one thing, the message, the broker, or neither:
//
//   - ack, and no basic.return: published (nil);
//   - basic.return (mandatory, routed to no queue): an error wrapping [ErrUnroutable]; the
//     relay counts an attempt;
//   - nack: an error wrapping both [ErrNacked] and outbox.ErrRefused. RabbitMQ nacks for
//     reasons of its own (a full queue with overflow reject-publish, a quorum queue without
//     a quorum, an internal error), never for the message's content, so no attempt is
//     counted. The next batch goes out on a new channel;
//   - a message that fails outbox.Message.Validate (but for the body's JSON syntax, which
//     the broker does not read and a json column cannot get wrong, and for headers named
//     aggregate_type or aggregate_id, which older code could store and the publisher
//     overwrites with the aggregate's, as it always did), whose content header
//     would not fit in the frame size negotiated with the broker, or whose body is over
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
//   - the deadline passed while another caller had the publisher: outbox.ErrNotSent, and
//     nothing was sent.
//
// # Deadlines
//
// The deadline of the context given to Publish (the relay passes its PublishTimeout) bounds
// every step: the wait for a free connection (a caller beyond [Config].Connections waits; one
// whose deadline passes first gives up), dialling and the AMQP handshake, opening a channel and running
// [Config].Setup, socket writes, and the confirms. amqp091-go writes to the socket
// synchronously and without a deadline, so a broker that stops reading (a resource alarm, a
// black-holed network) would hold a write for ever: when the deadline passes with the call
// still under way, the publisher closes the connection's socket, which ends every blocked
// step at once, and the next call connects again. Publish returns within the deadline plus
// the moment it takes to close a socket. The search for a refused message (above) stops a
// little before the deadline, so that running out of time there costs no reconnect.
//
// # Messages
//
// Messages are persistent, mandatory, and carry the outbox id as message-id, the event type,
// the creation time as timestamp, content type application/json, the correlation id, and the
// outbox headers plus aggregate_type and aggregate_id.
//
// # Connections
//
// The publisher connects lazily and again after the connection closed: each Publish call first
// makes sure it has an open channel (an explicit supervisor; amqp091-go's own recovery is not
// used, so every reconnect is visible here and in [Hooks]). A channel the broker closed over
// one message is replaced by a new channel on the same connection: a message's fault never
// costs a reconnect.
//
// # Concurrent batches
//
// With [Config].Connections above 1, the publisher serves that many Publish calls at once,
// each on an AMQP connection of its own, with its own channel, confirms and deadline: a relay
// with several batches in flight (outbox.Config.InFlightBatches) sends its next batch while
// the confirms of the one before are still coming, so the broker is never idle between
// batches. A connection each, not a channel each: amqp091-go writes every frame of a
// connection under one lock, and a call whose deadline passes closes its socket (see
// Deadlines), which on a shared connection would fail the other calls' batches too. So a
// connection that hangs or is lost costs only the batch on it; the others go on, and each
// connection reconnects on its own. A resource alarm blocks every connection that publishes,
// so each call finds its own connection blocked and returns outbox.ErrUnavailable.
// [Hooks].Connected reports each connection's changes with its index and how many are open.
// The publisher is an outbox.ConcurrentPublisher; with one connection (the default) it is
// used one batch at a time.
//
// # Several brokers
//
// [Config].URLs lists the nodes of a cluster. They are tried round-robin from a random
// start: the first connection goes to a random node, so that relays given the same list
// spread over the cluster; after a failed dial or a lost connection, the next attempt takes
// the next URL in the list, so that a dead node costs one refused dial and every other node
// is tried before it again. One connect tries each URL at most once, each within
// [Config].DialTimeout and an equal share of the deadline left, so that a node that accepts
// connections but does not answer (a paused one) cannot use up the call. There is no
// backoff here: the relay's own backoff spaces the calls that find no broker.
//
// A message confirmed by a quorum queue is on a majority of its replicas; a publisher whose
// node dies in the middle of a batch gets outbox.ErrUnavailable for the unconfirmed messages
// (never a false success), and the relay publishes them again through the next node. A quorum
// queue that lost its leader is led by another replica within a second or so; meanwhile the
// broker may nack (outbox.ErrRefused: no attempt counted) or hold the confirms.
package rabbitmq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
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
	// ErrNacked: the broker refused the message for a reason of its own (a full queue with
	// reject-publish, say). Errors wrapping it also wrap outbox.ErrRefused.
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
	// URLs are the nodes of a cluster, one URL each (see "Several brokers" in the package
	// documentation for the order they are tried in). Set URL or URLs, not both.
	URLs []string
	// ConnectionName shows in the management UI. Default "outbox-relay"
	// ([DefaultConnectionName]).
	ConnectionName string
	// DialTimeout bounds connecting to one broker (within the caller's deadline), and closing
	// a connection in [Publisher.Close]. Default 5s ([DefaultDialTimeout]).
	DialTimeout time.Duration
	// Connections is how many Publish calls the publisher serves at once, each on an AMQP
	// connection of its own (see "Concurrent batches" in the package documentation). Give
	// it the relay's outbox.Config.InFlightBatches, so that a relay sends its next batch
	// while the confirms of the one before are still coming. Default 1: batches are sent
	// one after the other. At most [MaxConnections].
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
// serves at once (see outbox.ConcurrentPublisher).
func (p *Publisher) ConcurrentPublishes() int { return len(p.lanes) }

// MessagingSystem returns "rabbitmq", the messaging.system attribute of the relay's publish
// spans (see outbox.Config.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "rabbitmq" }

// Publish sends msgs and waits for their confirms; see the package documentation for the
// meaning of each returned error.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	send := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := p.validate(msgs[i]); err != nil {
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
	frameMax := l.sess.conn.Config.FrameSize
	kept := send[:0]
	for _, i := range send {
		if err := fitsFrame(msgs[i], frameMax); err != nil {
			errs[i] = err
			continue
		}
		kept = append(kept, i)
	}
	send = kept
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

// validate returns outbox.Permanent with the reason if m can never be published: it fails
// Validate, or its body is over MaxBodyBytes.
//
// The body's JSON syntax is not checked here: the broker does not read the body, and
// PostgreSQL's json columns hold valid JSON only, so parsing every payload again would cost
// the relay CPU for nothing (encoding/json validates about as fast as it parses).
func (p *Publisher) validate(m outbox.Message) error {
	if len(m.Payload) == 0 {
		return outbox.Permanent(fmt.Errorf("%w: Payload is empty", outbox.ErrInvalidMessage))
	}
	envelope := m
	envelope.Payload = emptyObject
	_, aggType := m.Headers[outbox.HeaderAggregateType]
	_, aggID := m.Headers[outbox.HeaderAggregateID]
	if aggType || aggID {
		// Add refuses these names, but older code stored them, and the publisher always
		// overwrote them with the aggregate's: it still does, rather than bury the row.
		envelope.Headers = maps.Clone(m.Headers)
		delete(envelope.Headers, outbox.HeaderAggregateType)
		delete(envelope.Headers, outbox.HeaderAggregateID)
	}
	if err := envelope.Validate(); err != nil {
		return outbox.Permanent(err)
	}
	if p.cfg.MaxBodyBytes > 0 && len(m.Payload) > p.cfg.MaxBodyBytes {
		return outbox.Permanent(fmt.Errorf("%w: body of %d bytes is over the broker's max_message_size of %d (Config.MaxBodyBytes)",
			outbox.ErrTooLarge, len(m.Payload), p.cfg.MaxBodyBytes))
	}
	return nil
}

// fitsFrame returns outbox.Permanent if m's content header would not fit in one frame of
// frameMax bytes (0: no limit). Validate keeps the headers well under RabbitMQ's default
// frame_max; this catches a broker configured with a smaller one.
func fitsFrame(m outbox.Message, frameMax int) error {
	if n := contentHeaderFrameSize(m); frameMax > 0 && n > frameMax {
		return outbox.Permanent(fmt.Errorf("%w: its content header frame would take %d bytes, over the frame_max of %d negotiated with the broker",
			outbox.ErrInvalidMessage, n, frameMax))
	}
	return nil
}

// attemptResult is what one attempt left unsettled, and why.
type attemptResult struct {
	// unsettled are the messages that got no verdict of the broker: unconfirmed, not sent,
	// or nacked by amqp091-go itself when the channel closed.
	unsettled []int
	// closeErr is why the channel closed, when it closed.
	closeErr *amqp.Error
	// connOpen is whether the connection was still usable afterwards.
	connOpen bool
	// timedOut is whether ctx ended before every confirm came.
	timedOut bool
	// unavailable is the error for the unsettled messages when the cause is the broker or
	// the connection.
	unavailable error
}

// isolate reports whether the unsettled messages are to be published one at a time to find
// the one the broker refused: the broker closed the channel with a soft error (the
// connection is fine) and named no message.
func (a attemptResult) isolate() bool {
	return a.unavailable == nil && a.closeErr != nil && a.connOpen
}

// attempt publishes msgs[idx] on the current channel, waits for their confirms, and sets
// errs for every message the broker settled: acked (nil or unroutable) or nacked.
func (l *lane) attempt(ctx context.Context, msgs []outbox.Message, idx []int, errs []error) attemptResult {
	c, s := l.ch, l.sess
	confirms := make([]*amqp.DeferredConfirmation, len(idx))
	returned := map[string]string{}
	returns := c.returns // nil once closed: a closed channel would be read for ever
	takeReturn := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
	}
	drainReturns := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				takeReturn(r, ok)
			default:
				return
			}
		}
	}

	sent := 0
	for j, i := range idx {
		if _, blocked := s.isBlocked(); blocked || ctx.Err() != nil {
			break
		}
		dc, err := c.ch.PublishWithDeferredConfirm(msgs[i].Exchange, msgs[i].RoutingKey, true, false, publishing(msgs[i]))
		if err != nil {
			break // the channel or the connection is gone: nothing after this was sent
		}
		confirms[j] = dc
		sent = j + 1
		drainReturns() // the library waits only so long for a reader before it drops a return
	}

	// Wait for every confirm, collecting returns as they come. RabbitMQ sends a message's
	// basic.return before its ack, and amqp091-go hands both over from one goroutine in
	// that order; so once the last ack is in, every return is in c.returns or already read.
	var (
		closeErr   *amqp.Error
		closedSeen bool
		closed     = c.closed
		timedOut   bool
	)
	takeClose := func(e *amqp.Error) {
		closeErr, closedSeen, closed = e, true, nil
	}
wait:
	for j := 0; j < sent; j++ {
		for !isDone(confirms[j]) {
			select {
			case r, ok := <-returns:
				takeReturn(r, ok)
			case <-confirms[j].Done():
			case e := <-closed:
				// amqp091-go settles every pending confirm as a nack right after.
				takeClose(e)
			case <-s.changed:
				if _, blocked := s.isBlocked(); blocked {
					break wait
				}
			case <-ctx.Done():
				timedOut = true
				break wait
			}
		}
	}
	drainReturns()
	if !closedSeen {
		select {
		case e := <-closed:
			takeClose(e)
		default:
			if c.ch.IsClosed() {
				// The channel is closing: its reason follows at once (the library notifies
				// before it settles the pending confirms).
				select {
				case e := <-closed:
					takeClose(e)
				case <-ctx.Done():
					timedOut = true
				}
			}
		}
	}

	var (
		res    attemptResult
		nacked bool
	)
	for j, i := range idx {
		dc := confirms[j]
		switch {
		case j >= sent || !isDone(dc):
			res.unsettled = append(res.unsettled, i)
		case dc.Acked():
			if reason, ok := returned[msgs[i].ID.String()]; ok {
				errs[i] = fmt.Errorf("%w: %s", ErrUnroutable, reason)
			}
		case closedSeen || c.ch.IsClosed():
			// amqp091-go nacks every pending confirm when the channel closes: that is
			// not the broker's verdict on the message. It marks the channel closed before
			// it settles them, so a nack seen here with the channel closed may be one of
			// those even when its close was not read above (the guard closed the socket
			// at the deadline while this was classifying: with the socket's writes
			// batched, messages are sent, and wait for a confirm, before the socket blocks).
			// Taken as unsettled: at worst a real nack is published again.
			res.unsettled = append(res.unsettled, i)
		default:
			errs[i] = errNacked
			nacked = true
		}
	}
	res.closeErr, res.timedOut = closeErr, timedOut || ctx.Err() != nil && len(res.unsettled) > 0
	res.connOpen = !s.conn.IsClosed() && !l.guard.hasFired()
	if len(res.unsettled) > 0 || nacked {
		// Confirms or returns may still come for this channel's messages. And a nack may
		// come from the channel's own view of a queue: RabbitMQ 3.10 nacks every publish of
		// a channel that first sent to a quorum queue while its leader's node was down, long
		// after another replica took over, while a new channel publishes at once.
		c.stale = true
	}
	if len(res.unsettled) == 0 {
		return res
	}
	reason, blocked := s.isBlocked()
	switch {
	case blocked:
		res.unavailable = fmt.Errorf("%w: the broker blocked the connection: %s", outbox.ErrUnavailable, reason)
	case res.timedOut:
		res.unavailable = fmt.Errorf("%w: no confirm within the deadline: %v", outbox.ErrUnavailable, ctx.Err())
	case !res.connOpen:
		res.unavailable = fmt.Errorf("%w: connection closed: %v", outbox.ErrUnavailable, closeErr)
	case closeErr == nil || !closeErr.Server || !closeErr.Recover:
		// Closed by the client library, or a hard error on a connection still open
		// (neither should happen; be safe).
		res.unavailable = fmt.Errorf("%w: channel closed: %v", outbox.ErrUnavailable, closeErr)
	}
	return res
}

// isolate finds the messages of msgs[idx] the broker refuses, after it closed a channel over
// one or more of them without naming which. It publishes them one at a time, each on an open
// channel of the current connection, until one makes the broker close the channel: that one
// is charged with the broker's reason; the others are settled by their own confirms. Then it
// sends the rest together again, and searches again among them if the broker closes that
// channel too: one refused message costs a round trip per message before it, and one batch.
// Whatever the deadline leaves undone is outbox.ErrNotSent: the broker is fine, and no fault
// of those messages is known.
//
// The search stops a little before ctx's deadline, so that running out of time leaves the
// connection open: the guard closes the socket only when the deadline itself passes.
func (l *lane) isolate(ctx context.Context, msgs []outbox.Message, idx []int, errs []error, first *amqp.Error) {
	l.cfg.Logger.WarnContext(ctx, "rabbitmq publisher: the broker closed the channel without naming a message; publishing the unconfirmed ones one at a time",
		"connection_name", l.cfg.ConnectionName, "reason", first, "unconfirmed", len(idx))
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-min(time.Until(d)/10, isolateMargin)))
		defer cancel()
	}
	outOfTime := fmt.Errorf("%w: the deadline passed while looking for the message the broker refused (%v)", outbox.ErrNotSent, first)
	// send attempts msgs[some] on an open channel; it reports whether the caller is to go on,
	// having filled errs for every message of some the broker did not settle otherwise.
	send := func(some []int) (attemptResult, bool) {
		if ctx.Err() != nil {
			fill(errs, some, outOfTime)
			return attemptResult{}, false
		}
		if err := l.ensureChannel(ctx); err != nil {
			fill(errs, some, unavailable(ctx, err))
			return attemptResult{}, false
		}
		a := l.attempt(ctx, msgs, some, errs)
		switch {
		case len(a.unsettled) == 0, a.isolate():
			return a, true
		case a.timedOut && a.connOpen:
			fill(errs, a.unsettled, outOfTime)
		default:
			fill(errs, a.unsettled, a.unavailable)
		}
		return a, false
	}
	for len(idx) > 0 {
		refused := -1
		for k, i := range idx {
			a, ok := send(idx[k : k+1])
			if !ok {
				fill(errs, idx[k+1:], errs[i])
				return
			}
			if len(a.unsettled) > 0 {
				errs[i] = refusal(a.closeErr)
				l.cfg.Logger.WarnContext(ctx, "rabbitmq publisher: the broker refused a message",
					"message_id", msgs[i].ID, "message_type", msgs[i].Type, "aggregate_id", msgs[i].AggregateID, "error", errs[i])
				refused = k
				break
			}
		}
		if refused < 0 || refused == len(idx)-1 {
			return
		}
		a, ok := send(idx[refused+1:])
		if !ok || len(a.unsettled) == 0 {
			return
		}
		idx = a.unsettled // the broker closed this channel too: search among these
	}
}

// isolateMargin is how long before the deadline the search for a refused message stops.
const isolateMargin = 250 * time.Millisecond

// refusal is the error of a message the broker closed the channel over. 406
// PRECONDITION_FAILED on a publish is about the message itself (RabbitMQ: "invalid message",
// "message size … is larger than …"): no retry can help. Anything else (404 NOT_FOUND for an
// exchange, 403 ACCESS_REFUSED) may be repaired by declaring or granting, so the row's
// attempts count as usual.
func refusal(e *amqp.Error) error {
	err := fmt.Errorf("the broker closed the channel over this message: %d %s", e.Code, e.Reason)
	if e.Code == amqp.PreconditionFailed {
		return outbox.Permanent(err)
	}
	return err
}

// unavailable wraps a failure to get a channel.
func unavailable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v (deadline: %v)", outbox.ErrUnavailable, err, ctx.Err())
	}
	return fmt.Errorf("%w: %v", outbox.ErrUnavailable, err)
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

func fill(errs []error, idx []int, err error) {
	for _, i := range idx {
		errs[i] = err
	}
}

func publishing(m outbox.Message) amqp.Publishing {
	headers := make(amqp.Table, len(m.Headers)+2)
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[outbox.HeaderAggregateType] = m.AggregateType
	headers[outbox.HeaderAggregateID] = m.AggregateID
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   contentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.Headers[outbox.HeaderCorrelationID],
		MessageId:     m.ID.String(),
		Timestamp:     m.CreatedAt,
		Type:          m.Type,
		Body:          m.Payload,
	}
}

const contentType = "application/json"

var emptyObject = json.RawMessage(`{}`)

// contentHeaderFrameSize is the size on the wire of the content header frame that carries the
// properties [publishing] gives m, as amqp091-go writes it: the frame's type, channel and size
// (7 bytes) and end byte, then class, weight, body size and property flags, then each
// property present. RabbitMQ closes the connection (501 frame_too_large) when it exceeds the
// negotiated frame_max.
func contentHeaderFrameSize(m outbox.Message) int {
	n := 7 + 1 + 2 + 2 + 8 + 2
	short := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	short(contentType)
	n += m.HeaderBytes() // never empty: aggregate_type and aggregate_id are always there
	n++                  // delivery mode
	short(m.Headers[outbox.HeaderCorrelationID])
	short(m.ID.String())
	if !m.CreatedAt.IsZero() {
		n += 8
	}
	short(m.Type)
	return n
}

// ensureChannel makes sure p.ch is an open, fresh confirm-mode channel, connecting if needed.
// It sends nothing while the broker blocks the connection.
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
		func(url string, deadline time.Time) (*amqp.Connection, error) {
			s = &session{changed: make(chan struct{}, 1), watched: make(chan struct{})}
			conn, err := amqp.DialConfig(url, amqp.Config{
				Heartbeat:  10 * time.Second,
				Properties: props,
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

// guard closes the socket in use when the deadline of the call under way passes. That ends
// every step amqp091-go could be stuck in: a socket write to a broker that stopped reading, an
// RPC it never answers (channel.open, confirm.select, Setup's declarations), the handshake.
type guard struct {
	mu    sync.Mutex
	call  uint64 // counts arm calls: a late fire of an earlier call must not close anything
	armed bool
	fired bool
	raw   net.Conn
}

// arm starts watching ctx. The returned disarm reports whether the deadline closed the
// socket during the call.
func (g *guard) arm(ctx context.Context) (disarm func() bool) {
	g.mu.Lock()
	g.call++
	call := g.call
	g.armed, g.fired = true, false
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { g.fire(call) })
	return func() bool {
		stop()
		g.mu.Lock()
		defer g.mu.Unlock()
		g.armed = false
		return g.fired
	}
}

// use makes raw the socket the guard closes; at once if the deadline already passed.
func (g *guard) use(raw net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.raw = raw
	if g.armed && g.fired {
		_ = raw.Close()
	}
}

func (g *guard) fire(call uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed || g.call != call {
		return
	}
	g.fired = true
	if g.raw != nil {
		_ = g.raw.Close()
	}
}

func (g *guard) hasFired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.armed && g.fired
}

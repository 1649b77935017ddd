// Package amqptopo declares a service's RabbitMQ topology (docs/events.md, "Topology") so
// that a change of its settings never stops a running system and its dead-letter queue never
// drops a message.
//
// A service consumes one quorum queue, bound to the events exchange, whose x-delivery-limit
// (the broker's own bound on redeliveries, a safety net for a consumer that crashes in a loop
// on one message) dead-letters to the dead-letter exchange, where its dead-letter queue is
// bound with the queue's name.
//
// # Redeclaring with other arguments
//
// RabbitMQ refuses to redeclare a queue with arguments other than those it was created with
// (PRECONDITION_FAILED, and the channel is closed). A service whose delivery limit was
// changed in its configuration would then fail every connection attempt of its consumer and
// its relay. A [Declarer] declares on a connection of its own; when a queue exists with other
// arguments it checks, on a new channel, that the queue exists (a passive declare), logs a
// warning once, and goes on with the queue as it is. The configured arguments take effect
// when the queue is declared anew (deleted once drained); docs/events.md has the procedure.
//
// # Dead-letter queues never drop
//
// The dead-letter queue has no delivery limit: a message in it is kept however often it is
// peeked with a requeue (what the management UI's "get messages" does). On RabbitMQ 3.x a
// quorum queue without x-delivery-limit has none; from RabbitMQ 4.0 it has 20 by default,
// and x-delivery-limit -1 turns that off, a value 3.x takes to mean "drop at the first
// requeue". The Declarer reads the broker's version on connecting and declares what that
// version needs.
//
// # Clusters
//
// On a RabbitMQ cluster both queues are quorum queues with a replica on every node (up to
// the cluster's size when the queue is declared), or on [Topology].Replicas of them
// (x-quorum-initial-group-size). A Declarer given the URLs of several nodes connects to them
// in turn, from a random one, as the libraries' publisher and consumer do.
package amqptopo

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/redact"
)

// Queue arguments amqp091-go has no constant for.
const (
	ArgDeliveryLimit        = "x-delivery-limit"
	ArgDeadLetterExchange   = "x-dead-letter-exchange"
	ArgDeadLetterRoutingKey = "x-dead-letter-routing-key"
	// ArgQuorumInitialGroupSize is the number of replicas of a quorum queue, fixed when it
	// is declared.
	ArgQuorumInitialGroupSize = "x-quorum-initial-group-size"
)

// Topology is what one service declares.
type Topology struct {
	// Exchange is the events exchange: topic, durable.
	Exchange string
	// DeadLetterExchange is the dead-letter exchange: direct, durable.
	DeadLetterExchange string
	// Queue is the service's queue: quorum, bound to Exchange with each of RoutingKeys, and
	// dead-lettering to DeadLetterExchange with its own name as routing key.
	Queue       string
	RoutingKeys []string
	// DeadLetterQueue is bound to DeadLetterExchange with Queue as routing key: quorum,
	// without a delivery limit.
	DeadLetterQueue string
	// DeliveryLimit is Queue's x-delivery-limit.
	DeliveryLimit int
	// Replicas is the x-quorum-initial-group-size of both queues: how many nodes of a cluster
	// hold a replica. 0 leaves it to the broker: a replica on every node (RabbitMQ's
	// default). An odd number (3, 5) tolerates as many lost nodes as the next even one.
	Replicas int
}

// Names are the settings of a service's topology, the one shape both services give it
// (each declares its own Topology as a type of these, with its defaults and routing keys):
// the names of the events exchange, the dead-letter exchange, the service's queue and its
// dead-letter queue, and the queue's delivery limit; the fields are documented on
// [Topology].
type Names struct {
	Exchange           string
	DeadLetterExchange string
	Queue              string
	DeadLetterQueue    string
	DeliveryLimit      int
	Replicas           int
}

// The names both services default to (docs/events.md): one events exchange and one
// dead-letter exchange for the whole shop, and the broker's delivery limit.
const (
	DefaultExchange           = "shop.events"
	DefaultDeadLetterExchange = "shop.dlx"
	DefaultDeliveryLimit      = 20
)

// DefaultNames returns the default names of a service whose queue is queue: the shop's
// exchanges, queue+".dead" as its dead-letter queue, and [DefaultDeliveryLimit].
func DefaultNames(queue string) Names {
	return Names{
		Exchange: DefaultExchange, DeadLetterExchange: DefaultDeadLetterExchange,
		Queue: queue, DeadLetterQueue: queue + ".dead", DeliveryLimit: DefaultDeliveryLimit,
	}
}

// WithDefaults returns n with each zero field set to the one of defaults.
func (n Names) WithDefaults(defaults Names) Names {
	n.Exchange = cmp.Or(n.Exchange, defaults.Exchange)
	n.DeadLetterExchange = cmp.Or(n.DeadLetterExchange, defaults.DeadLetterExchange)
	n.Queue = cmp.Or(n.Queue, defaults.Queue)
	n.DeadLetterQueue = cmp.Or(n.DeadLetterQueue, defaults.DeadLetterQueue)
	n.DeliveryLimit = cmp.Or(n.DeliveryLimit, defaults.DeliveryLimit)
	n.Replicas = cmp.Or(n.Replicas, defaults.Replicas)
	return n
}

// Topology returns the topology of n with the service's queue bound to routingKeys.
func (n Names) Topology(routingKeys ...string) Topology {
	return Topology{
		Exchange: n.Exchange, DeadLetterExchange: n.DeadLetterExchange,
		Queue: n.Queue, RoutingKeys: routingKeys,
		DeadLetterQueue: n.DeadLetterQueue, DeliveryLimit: n.DeliveryLimit, Replicas: n.Replicas,
	}
}

// Validate reports a missing name, a delivery limit below 1 or a negative replica count.
func (t Topology) Validate() error {
	var errs []error
	if t.Exchange == "" || t.DeadLetterExchange == "" || t.Queue == "" || t.DeadLetterQueue == "" {
		errs = append(errs, fmt.Errorf("topology: every name is required: %+v", t))
	}
	if t.DeliveryLimit < 1 {
		errs = append(errs, fmt.Errorf("topology: delivery limit must be positive, is %d", t.DeliveryLimit))
	}
	if t.Replicas < 0 {
		errs = append(errs, fmt.Errorf("topology: replicas must be positive, or 0 for the broker's default, is %d", t.Replicas))
	}
	return errors.Join(errs...)
}

// QueueArgs are the arguments of the service's queue.
func (t Topology) QueueArgs() amqp.Table {
	args := amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum,
		ArgDeliveryLimit:  int64(t.DeliveryLimit),
		// A message the broker gives up on lands in the dead letters, not on the floor.
		ArgDeadLetterExchange:   t.DeadLetterExchange,
		ArgDeadLetterRoutingKey: t.Queue,
	}
	t.replicate(args)
	return args
}

// DeadLetterQueueArgs are the arguments of the dead-letter queue on a broker of the given
// major version: no delivery limit (-1 turns off RabbitMQ 4's default of 20; 3.x has none),
// and t's replicas.
func (t Topology) DeadLetterQueueArgs(brokerMajor int) amqp.Table {
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if brokerMajor >= 4 {
		args[ArgDeliveryLimit] = int64(-1)
	}
	t.replicate(args)
	return args
}

// replicate sets the replica count in args, unless it is the broker's default.
func (t Topology) replicate(args amqp.Table) {
	if t.Replicas > 0 {
		args[ArgQuorumInitialGroupSize] = int64(t.Replicas)
	}
}

// Declare declares the topology on ch, as a broker of version 3.x wants it, and fails on the
// first refusal: for tests and tools that own the broker. Services use a [Declarer].
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := t.declareExchanges(ch); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, t.DeadLetterQueueArgs(3)); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.DeadLetterQueue, err)
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, t.QueueArgs()); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.Queue, err)
	}
	return t.bind(ch)
}

func (t Topology) declareExchanges(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.DeadLetterExchange, err)
	}
	return nil
}

func (t Topology) bind(ch *amqp.Channel) error {
	for _, key := range t.RoutingKeys {
		if err := ch.QueueBind(t.Queue, key, t.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s with %s: %w", t.Queue, t.Exchange, key, err)
		}
	}
	if err := ch.QueueBind(t.DeadLetterQueue, t.Queue, t.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s with %s: %w", t.DeadLetterQueue, t.DeadLetterExchange, t.Queue, err)
	}
	return nil
}

// DefaultDialTimeout bounds a Declarer's connection attempt.
const DefaultDialTimeout = 10 * time.Second

// Declarer declares a Topology, tolerating queues that exist with other arguments (see the
// package documentation). It is safe for concurrent use.
type Declarer struct {
	urls []string
	tls  *tls.Config   // of amqps:// URLs, cloned per connection; nil: amqp091-go's
	next atomic.Uint32 // the index in urls of the next connection attempt
	t    Topology
	log  *slog.Logger
	dial time.Duration

	mu     sync.Mutex
	warned map[string]bool // queue → the mismatch was logged
}

// NewDeclarer returns a Declarer of t on the brokers at urls, the nodes of one cluster (at
// least one), connecting to amqps:// ones with tlsConf (nil: the system's roots). log nil
// discards.
func NewDeclarer(urls []string, tlsConf *tls.Config, t Topology, log *slog.Logger) (*Declarer, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if len(urls) == 0 {
		return nil, errors.New("topology: no broker url")
	}
	for i, u := range urls {
		if _, err := amqp.ParseURI(u); err != nil {
			return nil, fmt.Errorf("topology: broker url %d: %w", i+1, redact.URLError(err))
		}
	}
	d := &Declarer{urls: slices.Clone(urls), tls: tlsConf, t: t, log: cmp.Or(log, slog.New(slog.DiscardHandler)), dial: DefaultDialTimeout,
		warned: map[string]bool{}}
	d.next.Store(uint32(rand.N(len(urls))))
	return d, nil
}

// Topology returns what d declares.
func (d *Declarer) Topology() Topology { return d.t }

// Setup declares the topology, for the Setup of a pkg/inbox/inboxrabbitmq consumer or a
// pkg/outbox/outboxrabbitmq publisher: it runs on their every (re)connect, so a broker that lost
// the topology is repaired. It declares on a connection of its own and leaves the channel it
// is given alone: a refused declaration would close that channel. Nothing here retries or
// logs a failure: Setup returns it, and the caller's reconnect backoff spaces the next attempt
// (the consumer's OutageBaseDelay to OutageMaxDelay, the relay's outage backoff), so a
// broker that is away costs one connection attempt of the Declarer per attempt of theirs.
func (d *Declarer) Setup(*amqp.Channel) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.dial)
	defer cancel()
	return d.Declare(ctx)
}

// Declare connects, declares the exchanges, the dead-letter queue, the queue and the bindings,
// and disconnects. A queue that exists with other arguments is kept as it is, with a
// warning logged once per Declarer. ctx bounds the connection attempt.
func (d *Declarer) Declare(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return fmt.Errorf("topology: connect: %w", err)
	}
	defer conn.Close() //nolint:errcheck // a connection we are done with
	major := brokerMajor(conn.Properties)

	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("topology: open channel: %w", err)
	}
	if err := d.t.declareExchanges(ch); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	for _, q := range []struct {
		name string
		args amqp.Table
		dead bool
	}{
		{d.t.DeadLetterQueue, d.t.DeadLetterQueueArgs(major), true},
		{d.t.Queue, d.t.QueueArgs(), false},
	} {
		if ch, err = d.declareQueue(ctx, conn, ch, q.name, q.args, q.dead); err != nil {
			return err
		}
	}
	if err := d.t.bind(ch); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	return nil
}

// connect connects to the brokers in turn, each at most once, until one answers. Each gets
// the dial timeout, and no more than an equal share of the time left before ctx's deadline,
// so that a node that does not answer cannot use up the attempt.
func (d *Declarer) connect(ctx context.Context) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxshop topology " + d.t.Queue)
	var errs []error
	for k := range len(d.urls) {
		i := int(d.next.Add(1)-1) % len(d.urls)
		deadline := time.Now().Add(d.dial)
		if dl, ok := ctx.Deadline(); ok {
			if share := time.Now().Add(time.Until(dl) / time.Duration(len(d.urls)-k)); share.Before(deadline) {
				deadline = share
			}
		}
		conn, err := amqp.DialConfig(d.urls[i], amqp.Config{
			Properties:      props,
			Dial:            DialUntil(ctx, deadline),
			TLSClientConfig: TLSFor(d.tls, d.urls[i]),
		})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("no broker answered: %w", errors.Join(errs...))
}

// declareQueue declares a queue on ch. When the queue exists with other arguments, ch is
// closed by the broker: it checks on a new channel that the queue exists, warns, and returns
// that channel for what follows.
func (d *Declarer) declareQueue(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel, name string, args amqp.Table, dead bool) (*amqp.Channel, error) {
	_, err := ch.QueueDeclare(name, true, false, false, false, args)
	if err == nil {
		return ch, nil
	}
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed {
		return nil, fmt.Errorf("topology: declare queue %s: %w", name, err)
	}
	ch, cerr := conn.Channel()
	if cerr != nil {
		return nil, fmt.Errorf("topology: declare queue %s: %w; reopen channel: %w", name, err, cerr)
	}
	if _, perr := ch.QueueDeclarePassive(name, true, false, false, false, nil); perr != nil {
		return nil, fmt.Errorf("topology: declare queue %s: %w; passive declare: %w", name, err, perr)
	}
	d.warnOnce(ctx, name, amqpErr.Reason, dead)
	return ch, nil
}

func (d *Declarer) warnOnce(ctx context.Context, queue, reason string, dead bool) {
	d.mu.Lock()
	seen := d.warned[queue]
	d.warned[queue] = true
	d.mu.Unlock()
	if seen {
		return
	}
	msg := "queue exists with other arguments than configured; using it as it is (see docs/events.md to apply the configured ones)"
	if dead {
		msg = "dead-letter queue exists with other arguments than configured; using it as it is: if it has a delivery limit it may drop " +
			"messages that are requeued (see docs/events.md to declare it anew)"
	}
	d.log.WarnContext(ctx, msg, slog.String("queue", queue), slog.String("broker_says", reason))
}

// brokerMajor is the major version of the broker from its connection properties, or 3 when
// it does not say.
func brokerMajor(props amqp.Table) int {
	v, _ := props["version"].(string)
	major, _, _ := strings.Cut(v, ".")
	if n, err := strconv.Atoi(major); err == nil {
		return n
	}
	return 3
}

// TLSFor is the TLS configuration of a connection to the broker of url: a clone of tlsConf
// with url's host as its ServerName unless it has one, or nil when tlsConf is. A clone per
// connection, because amqp091-go writes the server name it uses into the config it gets.
func TLSFor(tlsConf *tls.Config, url string) *tls.Config {
	if tlsConf == nil {
		return nil
	}
	c := tlsConf.Clone()
	if c.ServerName == "" {
		if uri, err := amqp.ParseURI(url); err == nil {
			c.ServerName = uri.Host
		}
	}
	return c
}

// DialUntil is an amqp.Config Dial that connects within ctx and bounds both the TCP connect
// and the AMQP handshake by deadline (the library clears the deadline once connected), so
// that a node that accepts and then says nothing cannot hold a caller past it.
func DialUntil(ctx context.Context, deadline time.Time) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Deadline: deadline}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	}
}

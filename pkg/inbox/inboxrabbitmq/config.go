package inboxrabbitmq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/internal/decide"
)

// Defaults for [Config], used for fields left zero; each field's doc says what it means.
const (
	DefaultPrefetch        = 32
	DefaultAckEvery        = 8
	DefaultMaxDeliveries   = 5
	DefaultRetryBaseDelay  = time.Second
	DefaultRetryMaxDelay   = 30 * time.Second
	DefaultMaxHold         = 15 * time.Minute
	DefaultMaxMessageBytes = 1 << 20 // 1 MiB
	DefaultOutageBaseDelay = 500 * time.Millisecond
	DefaultOutageMaxDelay  = 30 * time.Second
	DefaultPublishTimeout  = 30 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
)

// Config configures a [Consumer]; [Config.WithDefaults] fills in the fields left zero.
type Config struct {
	// URL of the broker, amqp:// or amqps://. Set URL or URLs, not both.
	URL string
	// URLs are the nodes of a cluster, tried round-robin from a random one (see the README's
	// Several brokers). Set URL or URLs, not both.
	URLs []string
	// TLSClientConfig is the TLS configuration of the amqps:// URLs, for what a URL cannot
	// say: a private CA (RootCAs) rather than the system's roots, a client certificate, a
	// minimum version. Each connection gets a clone whose ServerName is its URL's host,
	// unless one is set. With it, every URL must be amqps:// and carry no TLS parameters of
	// its own (cacertfile, certfile, keyfile, server_name_indication); without it, an
	// amqps:// URL is checked against the system's roots, or the files its parameters name
	// (the README's TLS).
	TLSClientConfig *tls.Config
	// Queue to consume from. Required. Declare it in Setup, or beforehand.
	Queue string
	// Name is the inbox consumer name: messages are deduplicated per name, so several
	// handlers may consume copies of the same message into one database. Keep it stable
	// across deployments. Required; valid UTF-8 without NUL, at most inbox.MaxConsumerBytes.
	Name string
	// Handler applies a message. Required.
	Handler Handler
	// Tables names the inbox table, the default one when zero: messages are deduplicated per
	// table, then per Name. An invalid one is an error wrapping inbox.ErrInvalidTables.
	Tables inbox.Tables

	// Prefetch is the AMQP prefetch count: how many unacknowledged messages the broker hands
	// the consumer at once. Default 32 ([DefaultPrefetch]), at most 65535.
	Prefetch int
	// Concurrency is the number of inbox transactions at the same time, each of up to
	// BatchSize messages ([Consumer.PoolSize]). Default Prefetch / BatchSize, at most
	// Prefetch: keep Concurrency × BatchSize at Prefetch, so that in an outage every
	// prefetched message is held, not waiting. 1: one at a time. With batches, the messages
	// that go on alone (held, retried, or of a failed batch) run beside these, each in a
	// transaction of its own: up to Prefetch transactions in all.
	Concurrency int

	// BatchSize is the most deliveries handled in one inbox transaction, with one commit for
	// all (see the README's Batches and acknowledgements). Default 1: each delivery in its
	// own transaction. At most inbox.MaxBatch.
	BatchSize int
	// BatchWait is how long a transaction waits for more deliveries when fewer than
	// BatchSize have arrived. Default 0: it takes what has arrived and waits for none, so
	// that a lone message is not delayed; in a backlog batches then run about half full, and
	// a millisecond fills them (the README's Batches and acknowledgements). Unused with
	// BatchSize 1.
	BatchWait time.Duration
	// AckEvery is how many processed deliveries are acknowledged together, with one ack with
	// the multiple flag, once every delivery before them is settled; the rest go out at most
	// a few milliseconds after they were processed. 1 sends each ack at once, alone. Default
	// 8 ([DefaultAckEvery]) or a quarter of Prefetch, whichever is less, so that the broker
	// has room to deliver while acks wait; at most Prefetch.
	AckEvery int

	// MaxDeliveries is how many attempts a message gets, counting only failures that are
	// neither transient nor permanent, before it is dead-lettered. Default 5
	// ([DefaultMaxDeliveries]).
	MaxDeliveries int
	// RetryBaseDelay and RetryMaxDelay space the attempts of one message: the n-th counted
	// retry waits RetryBaseDelay·2^(n-1), at most RetryMaxDelay, jittered down to half of
	// it; the in-place retries of a held delivery back off the same way, capped at a
	// quarter of MaxHold. Defaults 1s and 30s ([DefaultRetryBaseDelay], [DefaultRetryMaxDelay];
	// RetryMaxDelay at least RetryBaseDelay).
	RetryBaseDelay time.Duration
	RetryMaxDelay  time.Duration
	// MaxHold bounds how long a delivery is held, from its arrival, while it fails
	// transiently; then it is handed back, uncounted. Keep it well below the broker's
	// consumer_timeout, after which RabbitMQ closes the channel of a consumer holding a
	// delivery and counts a delivery for every message on it. Default 15 minutes
	// ([DefaultMaxHold]), half of RabbitMQ's default consumer_timeout.
	MaxHold time.Duration

	// MaxMessageBytes is the largest body the consumer accepts; a larger message is
	// dead-lettered (ReasonBodyTooLarge) unparsed. It protects the handler's decoding, not
	// the consumer's memory (RabbitMQ's max_message_size bounds that). Default 1 MiB
	// ([DefaultMaxMessageBytes]).
	MaxMessageBytes int
	// ContentTypes are the media types the consumer accepts, compared without parameters
	// (list "" for messages without one), or any when empty; another is dead-lettered
	// (ReasonUnsupportedContentType), and so is JSON in a charset other than UTF-8.
	ContentTypes []string
	// Types, when not empty, are the message types (the type property) the handler
	// understands; another is dead-lettered (ReasonUnknownType). Empty accepts any type.
	Types []string

	// DeadLetterExchange and DeadLetterRoutingKey are where messages go that cannot be
	// processed (see the Reason constants); at least one is required. An empty exchange is
	// the default exchange, where the routing key is a queue name. A dead letter the broker
	// cannot route (mandatory flag, confirms) is not acknowledged: it stays in the queue.
	DeadLetterExchange   string
	DeadLetterRoutingKey string

	// Setup, optional, declares the topology on every (re)connect, before consuming, on the
	// consuming channel. An error ends the connection attempt, except a PRECONDITION_FAILED
	// for an "inequivalent arg" (a queue that exists with other arguments): then the consumer
	// warns ([Status].SetupWarning) and consumes the existing queue as it is. Setup stopped at
	// the failed declaration, so declare the consumed queue and its bindings last.
	Setup func(ch *amqp.Channel) error

	// OutageBaseDelay and OutageMaxDelay space the connection attempts while no broker
	// answers: OutageBaseDelay after the lost connection or a failed attempt, doubling up to
	// OutageMaxDelay, jittered down to half, and from OutageBaseDelay again once consuming.
	// Defaults 500ms and 30s ([DefaultOutageBaseDelay], [DefaultOutageMaxDelay];
	// OutageMaxDelay at least OutageBaseDelay).
	OutageBaseDelay time.Duration
	OutageMaxDelay  time.Duration
	// PublishTimeout bounds the wait for the broker's confirm of a retry copy, a hand-back
	// or a dead letter. Default 30s ([DefaultPublishTimeout]).
	PublishTimeout time.Duration
	// ShutdownTimeout bounds how long Run waits, after its context ended or the connection
	// was lost, for messages being handled to finish. Then their context is cancelled and
	// their transactions roll back. Default 30s ([DefaultShutdownTimeout]).
	ShutdownTimeout time.Duration

	// Logger receives the consumer's logs, with the attributes consumer, queue, message_id
	// and message_type; an outage is logged once, not per attempt. Nil discards.
	Logger *slog.Logger
	// Hooks are callbacks for metrics and tests; see [Hooks].
	Hooks Hooks

	// TracerProvider makes the consumer's process spans, one per delivery. Nil means
	// otel.GetTracerProvider(), which makes no spans until the application installs an SDK.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from a delivery's headers (W3C traceparent,
	// tracestate and baggage, say). Nil means otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns c validated, with every default filled in: what the consumer built
// from c ([NewConsumer]) will use. The error lists every problem, negative values included.
func (c Config) WithDefaults() (Config, error) {
	_, errs := parseBrokers(c.URL, c.URLs, c.TLSClientConfig)
	c.URLs = slices.Clone(c.URLs)
	errs = append(errs, c.checkRequired()...)
	errs = append(errs, c.fillLimits()...)
	errs = append(errs, c.fillDurations()...)
	errs = append(errs, c.fillAcceptance()...)
	c.fillObservability()
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("inbox: invalid consumer config: %w", err)
	}
	return c, nil
}

// checkRequired checks the fields without a default: the queue, the consumer name, the
// handler, the tables and the dead-letter destination.
func (c *Config) checkRequired() []error {
	var errs []error
	if c.Queue == "" {
		errs = append(errs, errors.New("queue is required"))
	}
	if c.Name == "" {
		errs = append(errs, errors.New("name (the inbox consumer name) is required"))
	} else if err := inbox.ValidateConsumer(c.Name); err != nil {
		errs = append(errs, &fieldError{"name", err})
	}
	if c.Handler == nil {
		errs = append(errs, errors.New("handler is required"))
	}
	if err := c.Tables.Validate(); err != nil {
		errs = append(errs, &fieldError{"tables", err})
	}
	if c.DeadLetterExchange == "" && c.DeadLetterRoutingKey == "" {
		errs = append(errs, errors.New("a dead-letter destination is required: set DeadLetterExchange and/or DeadLetterRoutingKey"))
	}
	return errs
}

// fillLimits checks and fills in the counts: Prefetch, BatchSize, then Concurrency (which
// defaults to, and is bounded by, the Prefetch filled in, per batch) and AckEvery, and
// MaxDeliveries.
func (c *Config) fillLimits() []error {
	var errs []error
	if c.Prefetch < 0 || c.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("prefetch must be between 0 (default %d) and 65535, got %d", DefaultPrefetch, c.Prefetch))
	}
	c.Prefetch = cmp.Or(c.Prefetch, DefaultPrefetch)
	if c.BatchSize < 0 || c.BatchSize > inbox.MaxBatch {
		errs = append(errs, fmt.Errorf("batch size must be between 0 (default 1) and %d (inbox.MaxBatch), got %d", inbox.MaxBatch, c.BatchSize))
	}
	c.BatchSize = max(1, c.BatchSize)
	if c.BatchSize > c.Prefetch {
		errs = append(errs, fmt.Errorf("batch size (%d) must not exceed prefetch (%d): a batch takes deliveries in hand", c.BatchSize, c.Prefetch))
	}
	if c.Concurrency < 0 || c.Concurrency > c.Prefetch {
		errs = append(errs, fmt.Errorf("concurrency must be between 0 (default: prefetch / batch size) and prefetch (%d), got %d", c.Prefetch, c.Concurrency))
	}
	c.Concurrency = cmp.Or(c.Concurrency, max(1, c.Prefetch/c.BatchSize))
	if c.AckEvery < 0 || c.AckEvery > c.Prefetch {
		errs = append(errs, fmt.Errorf("ack every must be between 0 (default %d) and prefetch (%d), got %d", DefaultAckEvery, c.Prefetch, c.AckEvery))
	}
	c.AckEvery = cmp.Or(c.AckEvery, max(1, min(DefaultAckEvery, c.Prefetch/4)))
	if c.MaxDeliveries < 0 {
		errs = append(errs, fmt.Errorf("max deliveries must be >= 0 (default %d), got %d", DefaultMaxDeliveries, c.MaxDeliveries))
	}
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, DefaultMaxDeliveries)
	return errs
}

// fillDurations checks and fills in the delays and timeouts.
func (c *Config) fillDurations() []error {
	var errs []error
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"retry base delay", c.RetryBaseDelay},
		{"retry max delay", c.RetryMaxDelay},
		{"outage base delay", c.OutageBaseDelay},
		{"outage max delay", c.OutageMaxDelay},
		{"publish timeout", c.PublishTimeout},
		{"shutdown timeout", c.ShutdownTimeout},
		{"max hold", c.MaxHold},
		{"batch wait", c.BatchWait},
	} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s must be >= 0 (0 means the default), got %s", d.name, d.value))
		}
	}
	// A max delay left 0 defaults to its default or to its base delay, whichever is larger;
	// one set below its base is an error.
	c.RetryBaseDelay = cmp.Or(c.RetryBaseDelay, DefaultRetryBaseDelay)
	if c.RetryMaxDelay != 0 && c.RetryMaxDelay < c.RetryBaseDelay {
		errs = append(errs, fmt.Errorf("retry max delay (%s) must not be below retry base delay (%s)", c.RetryMaxDelay, c.RetryBaseDelay))
	}
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, max(DefaultRetryMaxDelay, c.RetryBaseDelay))
	c.OutageBaseDelay = cmp.Or(c.OutageBaseDelay, DefaultOutageBaseDelay)
	if c.OutageMaxDelay != 0 && c.OutageMaxDelay < c.OutageBaseDelay {
		errs = append(errs, fmt.Errorf("outage max delay (%s) must not be below outage base delay (%s)", c.OutageMaxDelay, c.OutageBaseDelay))
	}
	c.OutageMaxDelay = cmp.Or(c.OutageMaxDelay, max(DefaultOutageMaxDelay, c.OutageBaseDelay))
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MaxHold = cmp.Or(c.MaxHold, DefaultMaxHold)
	return errs
}

// fillAcceptance checks and fills in what decides which messages are accepted before a
// transaction: MaxMessageBytes, and ContentTypes reduced to media types. The slices are
// copied, so that a caller changing its own does not change the consumer's.
func (c *Config) fillAcceptance() []error {
	var errs []error
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max message bytes must be >= 0 (0 means the default, %d), got %d", DefaultMaxMessageBytes, c.MaxMessageBytes))
	}
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.ContentTypes = decide.MediaTypes(c.ContentTypes)
	c.Types = slices.Clone(c.Types)
	return errs
}

// fillObservability fills in the global OpenTelemetry provider and propagator, and a logger
// that discards.
func (c *Config) fillObservability() {
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// fieldError is a config field's error that wraps an error of package inbox, without
// repeating the library's name inside the config error that already starts with it.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string {
	return e.field + ": " + strings.TrimPrefix(e.err.Error(), "inbox: ")
}
func (e *fieldError) Unwrap() error { return e.err }

package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Defaults for [Config].
const (
	DefaultPrefetch          = 32
	DefaultMaxDeliveries     = 5
	DefaultRetryDelay        = time.Second
	DefaultMaxRetryDelay     = 30 * time.Second
	DefaultReconnectDelay    = 500 * time.Millisecond
	DefaultMaxReconnectDelay = 30 * time.Second
	DefaultPublishTimeout    = 30 * time.Second
	DefaultShutdownTimeout   = 30 * time.Second
	// DefaultMaxHold is half of RabbitMQ's default consumer_timeout (30 minutes since 3.8.17),
	// the time after which the broker closes the channel of a consumer that holds an
	// unacknowledged delivery.
	DefaultMaxHold = 15 * time.Minute
	// DefaultMaxBodyBytes is 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
)

// Config configures a [Consumer].
type Config struct {
	// URL of the broker, amqp:// or amqps://. Set URL or URLs, not both.
	URL string
	// URLs are the nodes of a cluster, one URL each (see "Several brokers" in the package
	// documentation for the order they are tried in). Set URL or URLs, not both.
	URLs []string
	// Queue to consume from. Required. Declare it in Setup, or beforehand.
	Queue string
	// Name is the inbox consumer name: messages are deduplicated per name, so several
	// handlers may consume copies of the same message into one database. Keep it stable
	// across deployments. Required; valid UTF-8 without NUL, at most inbox.MaxConsumerBytes.
	Name string
	// Handler applies a message. Required.
	Handler Handler
	// Tables names the inbox table messages are recorded in: messages are deduplicated per
	// table and, within it, per Name. Default: the default inbox.Tables, inbox_messages. An
	// invalid value makes [NewConsumer] return an error wrapping inbox.ErrInvalidTables.
	Tables inbox.Tables

	// Prefetch is the AMQP prefetch count: how many unacknowledged messages the broker hands
	// the consumer at once, at most 65535. Default 32 ([DefaultPrefetch]).
	Prefetch int
	// Concurrency is the number of messages handled at the same time, each in its own
	// transaction (so up to Concurrency pool connections). Default Prefetch; it cannot
	// exceed Prefetch. Use 1 to handle messages one at a time (see the package doc on
	// ordering).
	Concurrency int

	// MaxDeliveries is how many times a message is attempted before it is dead-lettered.
	// Default 5 ([DefaultMaxDeliveries]).
	MaxDeliveries int
	// RetryDelay is the wait before the first retry; the n-th retry waits RetryDelay·2^(n-1),
	// at most MaxRetryDelay, jittered by up to half of it. Default 1s ([DefaultRetryDelay]).
	RetryDelay time.Duration
	// MaxRetryDelay caps RetryDelay's growth. Default 30s ([DefaultMaxRetryDelay]), or
	// RetryDelay if larger.
	// RetryDelay and MaxRetryDelay also space the in-place retries of a held delivery,
	// capped at a quarter of MaxHold.
	MaxRetryDelay time.Duration

	// MaxHold bounds how long a delivery is held, counted from its receipt, while it fails
	// transiently (the database unreachable, a deadlock, an error marked inbox.Transient).
	// Then the consumer republishes a copy to the tail of the queue and acknowledges the
	// original, which the broker does not count as a delivery, and the copy starts a new
	// hold when it arrives. Keep it well below the broker's consumer_timeout (RabbitMQ
	// closes the channel of a consumer that keeps a delivery unacknowledged longer, and
	// counts a delivery for every message on it). Default 15 minutes ([DefaultMaxHold]),
	// half of RabbitMQ's default consumer_timeout.
	MaxHold time.Duration

	// MaxBodyBytes is the largest body the consumer accepts; a larger message is
	// dead-lettered (ReasonBodyTooLarge) before its body is parsed. The broker has already
	// received the whole body by then (RabbitMQ's max_message_size bounds that), so this
	// protects the handler's decoding, not the consumer's memory. Default 1 MiB
	// ([DefaultMaxBodyBytes]).
	MaxBodyBytes int
	// ContentTypes, when not empty, are the media types the consumer accepts (compared
	// case-insensitively, without parameters, e.g. "application/json"); a message with
	// another content type is dead-lettered (ReasonUnsupportedContentType). List "" to
	// accept messages without a content type. Empty accepts any content type. Independently
	// of this list, a JSON content type whose charset parameter is not UTF-8 is refused: JSON
	// between systems is UTF-8 (RFC 8259).
	ContentTypes []string
	// Types, when not empty, are the message types (the type property) the handler
	// understands; a message of another type is dead-lettered (ReasonUnknownType) without
	// a transaction. Empty accepts any type and leaves unknown types to the handler.
	Types []string

	// DeadLetterExchange and DeadLetterRoutingKey are where messages go that cannot be
	// processed (see the Reason constants). Required: at least one must be set. An empty
	// exchange is the default exchange, where the routing key is a queue name. The consumer
	// publishes with the mandatory flag and publisher confirms: a dead letter the broker
	// cannot route is not acknowledged, it stays in the queue.
	DeadLetterExchange   string
	DeadLetterRoutingKey string

	// Setup declares the topology on every (re)connect, before consuming, on the consuming
	// channel (exchanges, the queue, its bindings, the dead-letter exchange and queue).
	// Optional. An error ends the connection attempt; the consumer retries it with backoff.
	//
	// One error is tolerated: PRECONDITION_FAILED for an "inequivalent arg", which RabbitMQ
	// answers when a queue or exchange exists with other arguments than declared (someone
	// changed x-delivery-limit, say). The consumer logs a warning, reports it in
	// [Status].SetupWarning, opens a new channel and consumes the existing queue as it is,
	// if it exists. Setup stopped at the failed declaration, so declare the exchanges and
	// the dead-letter queue before the consumed queue and its bindings, and change queue
	// arguments through a policy or by recreating the queue (see the package doc).
	Setup func(ch *amqp.Channel) error

	// ReconnectDelay is the wait before the first reconnect attempt; it doubles per failed
	// attempt up to MaxReconnectDelay, each wait jittered down to half of that, and starts
	// over once the consumer consumes again. An attempt tries each of URLs at most once
	// (see "Several brokers" in the package documentation), starting after the node of the
	// connection lost. Defaults 500ms and 30s
	// ([DefaultReconnectDelay], [DefaultMaxReconnectDelay]).
	ReconnectDelay    time.Duration
	MaxReconnectDelay time.Duration
	// PublishTimeout bounds the wait for the broker's confirm of a retry copy or a dead
	// letter. Default 30s ([DefaultPublishTimeout]).
	PublishTimeout time.Duration
	// ShutdownTimeout bounds how long Run waits, after its context ended or the connection
	// was lost, for messages being handled to finish. Then their context is cancelled and
	// their transactions roll back. Default 30s ([DefaultShutdownTimeout]).
	ShutdownTimeout time.Duration

	// Logger receives the consumer's logs. Nil discards them.
	Logger *slog.Logger
	// Hooks are optional callbacks for metrics and tests.
	Hooks Hooks

	// TracerProvider makes the consumer's process spans, one per delivery (see the package
	// documentation's Tracing section). nil means the global provider,
	// otel.GetTracerProvider(), which makes no spans until the application installs an
	// OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from a delivery's headers (W3C traceparent,
	// tracestate and baggage with the usual propagators). nil means the global propagator,
	// otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator
}

// withDefaults validates c and fills in the defaults. It reports every problem found, not
// only the first; each phase checks its fields before filling in their defaults, so that a
// field given as 0 takes its default and a negative one is an error.
func (c Config) withDefaults() (Config, error) {
	_, errs := parseBrokers(c.URL, c.URLs)
	c.URLs = slices.Clone(c.URLs)
	errs = append(errs, c.checkRequired()...)
	errs = append(errs, c.fillLimits()...)
	errs = append(errs, c.fillDurations()...)
	errs = append(errs, c.fillAcceptance()...)
	c.fillObservability()
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("rabbitmq: invalid consumer config: %w", err)
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
		errs = append(errs, fmt.Errorf("name: %w", err))
	}
	if c.Handler == nil {
		errs = append(errs, errors.New("handler is required"))
	}
	if err := c.Tables.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("tables: %w", err))
	}
	if c.DeadLetterExchange == "" && c.DeadLetterRoutingKey == "" {
		errs = append(errs, errors.New("a dead-letter destination is required: set DeadLetterExchange and/or DeadLetterRoutingKey"))
	}
	return errs
}

// fillLimits checks and fills in the counts: Prefetch, then Concurrency (which defaults to,
// and is bounded by, the Prefetch filled in), and MaxDeliveries.
func (c *Config) fillLimits() []error {
	var errs []error
	if c.Prefetch < 0 || c.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("prefetch must be between 0 (default %d) and 65535, got %d", DefaultPrefetch, c.Prefetch))
	}
	c.Prefetch = cmp.Or(c.Prefetch, DefaultPrefetch)
	if c.Concurrency < 0 || c.Concurrency > c.Prefetch {
		errs = append(errs, fmt.Errorf("concurrency must be between 0 (default: prefetch) and prefetch (%d), got %d", c.Prefetch, c.Concurrency))
	}
	c.Concurrency = cmp.Or(c.Concurrency, c.Prefetch)
	if c.MaxDeliveries < 0 {
		errs = append(errs, fmt.Errorf("max deliveries must be >= 0 (default %d), got %d", DefaultMaxDeliveries, c.MaxDeliveries))
	}
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, DefaultMaxDeliveries)
	return errs
}

// fillDurations checks and fills in the delays and timeouts. A maximum left 0 defaults to
// its default or to its base delay, whichever is larger; one set below its base is an error.
func (c *Config) fillDurations() []error {
	var errs []error
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"retry delay", c.RetryDelay},
		{"max retry delay", c.MaxRetryDelay},
		{"reconnect delay", c.ReconnectDelay},
		{"max reconnect delay", c.MaxReconnectDelay},
		{"publish timeout", c.PublishTimeout},
		{"shutdown timeout", c.ShutdownTimeout},
		{"max hold", c.MaxHold},
	} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s must be >= 0 (0 means the default), got %s", d.name, d.value))
		}
	}
	c.RetryDelay = cmp.Or(c.RetryDelay, DefaultRetryDelay)
	if c.MaxRetryDelay != 0 && c.MaxRetryDelay < c.RetryDelay {
		errs = append(errs, fmt.Errorf("max retry delay (%s) must not be below retry delay (%s)", c.MaxRetryDelay, c.RetryDelay))
	}
	c.MaxRetryDelay = cmp.Or(c.MaxRetryDelay, max(DefaultMaxRetryDelay, c.RetryDelay))
	c.ReconnectDelay = cmp.Or(c.ReconnectDelay, DefaultReconnectDelay)
	if c.MaxReconnectDelay != 0 && c.MaxReconnectDelay < c.ReconnectDelay {
		errs = append(errs, fmt.Errorf("max reconnect delay (%s) must not be below reconnect delay (%s)", c.MaxReconnectDelay, c.ReconnectDelay))
	}
	c.MaxReconnectDelay = cmp.Or(c.MaxReconnectDelay, max(DefaultMaxReconnectDelay, c.ReconnectDelay))
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MaxHold = cmp.Or(c.MaxHold, DefaultMaxHold)
	return errs
}

// fillAcceptance checks and fills in what decides which messages are accepted (see
// [Config.Refusal]): MaxBodyBytes, and ContentTypes reduced to media types. The slices are
// copied, so that a caller changing its own does not change the consumer's.
func (c *Config) fillAcceptance() []error {
	var errs []error
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes must be >= 0 (0 means the default, %d), got %d", DefaultMaxBodyBytes, c.MaxBodyBytes))
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.ContentTypes = mediaTypes(c.ContentTypes)
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

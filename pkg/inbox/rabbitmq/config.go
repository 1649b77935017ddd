package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Headers the consumer reads and writes. Producers need not set any of them.
const (
	// HeaderRetries counts the retries of a message: absent (0) on the original, 1 on the
	// first retry copy, and so on. [Delivery].DeliveryCount is this value plus one.
	HeaderRetries = "x-outboxshop-retries"
	// HeaderDeadReason on a dead letter says why it was dead-lettered: one of the Reason
	// constants, a colon and the details (e.g. "malformed-json: unexpected end of JSON input").
	HeaderDeadReason = "x-outboxshop-dead-reason"
	// HeaderOriginalQueue on a dead letter names the queue it was consumed from.
	HeaderOriginalQueue = "x-outboxshop-original-queue"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey keep the exchange and routing key a
	// message was first published with, on retry copies (which travel through the default
	// exchange) and on dead letters.
	HeaderOriginalExchange   = "x-outboxshop-original-exchange"
	HeaderOriginalRoutingKey = "x-outboxshop-original-routing-key"
	// HeaderOriginalExpiration keeps the per-message TTL of a dead letter, which is published
	// without one so that it cannot expire in the dead-letter queue.
	HeaderOriginalExpiration = "x-outboxshop-original-expiration"
	// HeaderOriginalUserID keeps a user-id property that names another user than the
	// consumer's: RabbitMQ refuses to publish a message whose user-id is not the publisher's.
	HeaderOriginalUserID = "x-outboxshop-original-user-id"
)

// Reasons for dead-lettering, the first word of [HeaderDeadReason] and the reason passed to
// [Hooks].DeadLettered (a short, fixed set: fit for a metric label; [Reasons] lists them).
// Each names what a person must look at; none is used for a message that an outage or a
// lost race made fail.
const (
	// ReasonMissingMessageID: the message has no message-id property, so the inbox cannot
	// deduplicate it.
	ReasonMissingMessageID = "missing-message-id"
	// ReasonInvalidMessageID: the message-id cannot be stored by the inbox: it is not valid
	// UTF-8, contains a NUL byte, or is longer than inbox.MaxMessageIDBytes.
	ReasonInvalidMessageID = "invalid-message-id"
	// ReasonInvalidMessageType: the type property cannot be stored by the inbox, for the same
	// reasons (limit inbox.MaxMessageTypeBytes).
	ReasonInvalidMessageType = "invalid-message-type"
	// ReasonBodyTooLarge: the body is longer than [Config].MaxBodyBytes. It is not parsed.
	ReasonBodyTooLarge = "body-too-large"
	// ReasonUnsupportedContentType: the content type is not one of [Config].ContentTypes,
	// or it is a JSON type with a charset other than UTF-8.
	ReasonUnsupportedContentType = "unsupported-content-type"
	// ReasonUnknownType: the type property is not one of [Config].Types.
	ReasonUnknownType = "unknown-type"
	// ReasonMalformedJSON: the content type is application/json (or empty, or ends in +json)
	// and the body is not valid JSON, or not valid UTF-8.
	ReasonMalformedJSON = "malformed-json"
	// ReasonPermanent: the handler returned an error marked with inbox.Permanent (an
	// unknown schema version, a payload that breaks the contract), or the inbox could not
	// store the message's id or type in this database.
	ReasonPermanent = "permanent-error"
	// ReasonMaxDeliveries: the handler failed on each of [Config].MaxDeliveries attempts
	// with errors that inbox.Classify does not call transient (a constraint violation, a
	// data exception, an error of its own).
	ReasonMaxDeliveries = "max-deliveries"
)

// Reasons returns every dead-letter reason, in the order the consumer checks them.
func Reasons() []string {
	return []string{ReasonMissingMessageID, ReasonInvalidMessageID, ReasonInvalidMessageType, ReasonBodyTooLarge,
		ReasonUnsupportedContentType, ReasonUnknownType, ReasonMalformedJSON, ReasonPermanent, ReasonMaxDeliveries}
}

// Reasons for handing a delivery back to the broker unprocessed, passed to
// [Hooks].HandedBack.
const (
	// HandBackHoldLimit: the delivery was held for [Config].MaxHold after transient
	// failures. The consumer republished a copy to the tail of the queue and acknowledged
	// the original: the broker does not count this as a delivery.
	HandBackHoldLimit = "hold-limit"
	// HandBackShutdown: the consumer stopped while holding the delivery. Handed back like
	// HandBackHoldLimit, uncounted.
	HandBackShutdown = "shutdown"
	// HandBackRequeued: the delivery went back by a reject with requeue, or because its
	// channel closed: it was prefetched but not started when the consumer stopped, its
	// handler was cut short by [Config].ShutdownTimeout, the broker connection was lost,
	// or the uncounted hand-back could not be published. The broker counts it (a quorum
	// queue raises x-delivery-count and applies x-delivery-limit).
	HandBackRequeued = "requeued"
)

// Failpoint names passed to [Hooks].Failpoint. A chaos test makes the hook kill the process
// at one of them to prove that no crash loses or doubles an effect.
const (
	// FailpointBeforeCommit: the handler returned nil; its changes and the inbox row are in
	// the open transaction, not committed. A crash here rolls them back, the message is
	// redelivered and processed again.
	FailpointBeforeCommit = "consumer.before-commit"
	// FailpointAfterCommit: the transaction committed; the message is not acknowledged yet.
	// A crash here makes the broker redeliver it, and the inbox reports a duplicate.
	FailpointAfterCommit = "consumer.after-commit"
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

// Handler applies one message inside the inbox transaction tx. It writes its changes through
// tx and must not commit or roll it back. Returning nil commits the changes together with the
// inbox row and acknowledges the message. Returning an error rolls everything back; what
// happens next depends on inbox.Classify(err):
//
//   - transient (the database unreachable, a deadlock or serialization failure, a lost
//     connection, an error wrapped with inbox.Transient): the consumer holds the delivery
//     and calls the handler again in place, after a backoff, without counting an attempt;
//   - permanent (wrapped with inbox.Permanent): the message is dead-lettered at once;
//   - anything else, including constraint violations and data exceptions: the attempt
//     counts, and the message is retried until [Config].MaxDeliveries, then dead-lettered.
//
// A handler may be called again for the same message after an error, a crash or a broker
// outage, but its committed effects happen once. It may run concurrently with other
// invocations (see [Config].Concurrency). ctx is cancelled when the consumer stops and the
// handler did not finish within [Config].ShutdownTimeout, and at once on stop when the call
// is a retry of a held delivery.
type Handler func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Delivery is the message passed to a [Handler].
type Delivery struct {
	// ID is the AMQP message-id property, the inbox key. Never empty.
	ID string
	// Type is the AMQP type property.
	Type string
	// Exchange and RoutingKey are those the message was first published with, also on retry
	// copies (which the consumer republishes through the default exchange).
	Exchange   string
	RoutingKey string
	// Headers are the AMQP headers, including the consumer's own (x-outboxshop-…) and the
	// broker's (x-delivery-count on a quorum queue's redeliveries).
	Headers       amqp.Table
	ContentType   string
	CorrelationID string
	Timestamp     time.Time
	Body          []byte
	// Redelivered is the broker's flag: this copy was delivered before and not acknowledged
	// (after a crash, a lost connection or a graceful stop).
	Redelivered bool
	// DeliveryCount is 1 on the first attempt, 2 on the first retry, and so on up to
	// [Config].MaxDeliveries. Broker redeliveries (Redelivered), transient failures and
	// hand-backs do not count.
	DeliveryCount int
}

// Hooks are optional callbacks for metrics and fault injection. Nil fields are skipped. They
// are called from the consumer's goroutines, concurrently, and must return quickly: a hook
// that blocks holds up the delivery it reports on, and the worker handling it. Nothing
// recovers a hook's panic: it ends the process, as any unrecovered panic does, and the
// deliveries not yet acknowledged go back to the broker with the connection. Each takes
// one event struct, so that an event can gain fields without breaking a hook (the outbox
// relay's hooks have the same shape). An event's Type is the message's type property as
// received: it may be anything, even invalid UTF-8, so map it to a known set before using it
// as a metric label (package rabbitmqmetrics does).
type Hooks struct {
	// Processed is called after a message was committed or found in the inbox (a
	// duplicate), and its acknowledgement was sent.
	Processed func(ProcessedMessage)
	// HandlerError is called for every failed attempt: an error returned by the handler, or
	// an error of the database (begin, insert, commit), transient ones included. Use
	// inbox.Classify on its Err to tell them apart.
	HandlerError func(HandlerFailure)
	// Retried is called after a retry copy was published.
	Retried func(Retry)
	// DeadLettered is called after a message was dead-lettered and acknowledged.
	DeadLettered func(DeadLetter)
	// Held is called when a delivery starts being held after a transient failure, and when
	// the hold ends (processed, dead-lettered, handed back).
	Held func(Hold)
	// HandedBack is called when a delivery went back to the broker unprocessed.
	HandedBack func(HandBack)
	// Connected is called with Up true when the consumer starts consuming on a new
	// connection, and with Up false when it lost it (or stopped).
	Connected func(ConnectionChange)
	// Failpoint is called at FailpointBeforeCommit when a handler returned nil, and at
	// FailpointAfterCommit when its transaction committed (not for duplicates, which commit
	// nothing). A chaos test makes it kill the process. Only for tests; nil costs a nil check.
	Failpoint func(FailpointHit)
}

// ProcessedMessage is passed to [Hooks].Processed.
type ProcessedMessage struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Duplicate is true when the message was found in the inbox and skipped.
	Duplicate bool
	// Duration runs from receipt to acknowledgement.
	Duration time.Duration
	// SpanContext is the delivery's process span's context (so that a duration histogram can
	// carry the trace id as an exemplar); the zero SpanContext when no span was made.
	SpanContext trace.SpanContext
}

// HandlerFailure is passed to [Hooks].HandlerError.
type HandlerFailure struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Err is the attempt's error.
	Err error
}

// Retry is passed to [Hooks].Retried.
type Retry struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// DeliveryCount is the number of the attempt that failed.
	DeliveryCount int
}

// DeadLetter is passed to [Hooks].DeadLettered.
type DeadLetter struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Reason is one of the Reason constants.
	Reason string
}

// Hold is passed to [Hooks].Held.
type Hold struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Held is true when the hold starts, false when it ends.
	Held bool
}

// HandBack is passed to [Hooks].HandedBack.
type HandBack struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Reason is one of the HandBack constants.
	Reason string
}

// ConnectionChange is passed to [Hooks].Connected.
type ConnectionChange struct {
	// Consumer is the inbox consumer name ([Config].Name).
	Consumer string
	// Up is true when the consumer consumes on a connection.
	Up bool
	// Err is why the connection was lost; nil when it came up or the consumer stopped.
	Err error
	// Broker is the host:port (and vhost, unless "/") of the broker consumed from, or of the
	// one whose connection was lost. Never the credentials.
	Broker string
}

// FailpointHit is passed to [Hooks].Failpoint.
type FailpointHit struct {
	// Name is the point reached, one of the Failpoint constants.
	Name string
}

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

// withDefaults validates c and fills in the defaults.
func (c Config) withDefaults() (Config, error) {
	_, errs := parseBrokers(c.URL, c.URLs)
	c.URLs = slices.Clone(c.URLs)
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
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes must be >= 0 (0 means the default, %d), got %d", DefaultMaxBodyBytes, c.MaxBodyBytes))
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	contentTypes := make([]string, 0, len(c.ContentTypes))
	for _, ct := range c.ContentTypes {
		contentTypes = append(contentTypes, mediaType(ct))
	}
	c.ContentTypes = contentTypes
	c.Types = slices.Clone(c.Types)
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("rabbitmq: invalid consumer config: %w", err)
	}
	return c, nil
}

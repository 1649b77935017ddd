package app

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/caarlos0/env/v11"

	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
)

// Config is the warehouse's configuration, read once from the environment by [LoadConfig].
// [DefaultConfig] holds the defaults, which work on a developer machine with PostgreSQL on
// 127.0.0.1:5432 and RabbitMQ on 127.0.0.1:5672.
type Config struct {
	// DatabaseURL is the warehouse's own database; it is created when missing.
	DatabaseURL string `env:"WAREHOUSE_DATABASE_URL"`
	// DatabaseMaxConns bounds the pool: the consumer uses up to ConsumerConcurrency
	// connections, the relay two, the API the rest.
	DatabaseMaxConns int32 `env:"WAREHOUSE_DATABASE_MAX_CONNS"`
	// AMQPURL is the broker.
	AMQPURL string `env:"WAREHOUSE_AMQP_URL"`

	// HTTPAddr is where `api` and `all` serve the API, /healthz, /readyz and /metrics.
	HTTPAddr string `env:"WAREHOUSE_HTTP_ADDR"`
	// RelayHTTPAddr is where `relay` serves /healthz, /readyz and /metrics.
	RelayHTTPAddr string `env:"WAREHOUSE_RELAY_HTTP_ADDR"`
	// DBTimeout bounds the database work of one HTTP request, and one attempt to connect.
	DBTimeout time.Duration `env:"WAREHOUSE_HTTP_DB_TIMEOUT"`
	// ShutdownTimeout bounds a graceful stop: in-flight requests and messages get this long.
	ShutdownTimeout time.Duration `env:"WAREHOUSE_SHUTDOWN_TIMEOUT"`
	// BrokerDownGrace is how long the consumer, or the relay, may be cut off from the broker
	// before /readyz answers 503.
	BrokerDownGrace time.Duration `env:"WAREHOUSE_BROKER_DOWN_GRACE"`

	// Topology names (docs/events.md).
	EventsExchange     string `env:"WAREHOUSE_EVENTS_EXCHANGE"`
	DeadLetterExchange string `env:"WAREHOUSE_DEAD_LETTER_EXCHANGE"`
	Queue              string `env:"WAREHOUSE_QUEUE"`
	DeadLetterQueue    string `env:"WAREHOUSE_DEAD_LETTER_QUEUE"`
	// QueueDeliveryLimit is the queue's x-delivery-limit, set when the queue is declared. A
	// queue that exists with another one keeps it, with a warning in the log
	// (docs/events.md).
	QueueDeliveryLimit int `env:"WAREHOUSE_QUEUE_DELIVERY_LIMIT"`

	// Consumer tuning.
	ConsumerPrefetch      int           `env:"WAREHOUSE_CONSUMER_PREFETCH"`
	ConsumerConcurrency   int           `env:"WAREHOUSE_CONSUMER_CONCURRENCY"`
	ConsumerMaxDeliveries int           `env:"WAREHOUSE_CONSUMER_MAX_DELIVERIES"`
	ConsumerRetryDelay    time.Duration `env:"WAREHOUSE_CONSUMER_RETRY_DELAY"`
	// ConsumerMaxRetryDelay caps the consumer's retry backoff, also between the in-place
	// retries of a message held through a database outage; ConsumerMaxHold is how long such a
	// message is held before it is handed back to the queue (without counting a delivery).
	ConsumerMaxRetryDelay time.Duration `env:"WAREHOUSE_CONSUMER_MAX_RETRY_DELAY"`
	ConsumerMaxHold       time.Duration `env:"WAREHOUSE_CONSUMER_MAX_HOLD"`
	// InboxRetention is how long processed message ids are remembered. It must exceed the
	// longest time in which a duplicate can still arrive.
	InboxRetention time.Duration `env:"WAREHOUSE_INBOX_RETENTION"`

	// Relay tuning.
	RelayPollInterval time.Duration `env:"WAREHOUSE_RELAY_POLL_INTERVAL"`
	RelayBatchSize    int           `env:"WAREHOUSE_RELAY_BATCH_SIZE"`
	RelayMaxAttempts  int           `env:"WAREHOUSE_RELAY_MAX_ATTEMPTS"`
	// RelayPublishTimeout bounds every step of a batch's publish; RelayClaimTimeout is the
	// longest a paused or hung relay holds its claimed rows before PostgreSQL ends its
	// transaction (pkg/outbox Config.ClaimTimeout; must exceed the publish timeout).
	RelayPublishTimeout time.Duration `env:"WAREHOUSE_RELAY_PUBLISH_TIMEOUT"`
	RelayClaimTimeout   time.Duration `env:"WAREHOUSE_RELAY_CLAIM_TIMEOUT"`
	// RelayMaxMessageBytes is the largest payload the relay sends; a larger row is dead at once.
	RelayMaxMessageBytes int `env:"WAREHOUSE_RELAY_MAX_MESSAGE_BYTES"`
	// OutboxRetention is how long published outbox rows are kept.
	OutboxRetention time.Duration `env:"WAREHOUSE_OUTBOX_RETENTION"`

	// LogFormat is json or text; LogLevel debug, info, warn or error.
	LogFormat string `env:"WAREHOUSE_LOG_FORMAT"`
	LogLevel  string `env:"WAREHOUSE_LOG_LEVEL"`

	// Failpoints arms crash points for chaos tests (internal/failpoint), e.g.
	// "relay.after-publish=kill@25,consumer.after-commit=kill". Empty arms none.
	Failpoints string `env:"CHAOS_FAILPOINTS"`
}

// DefaultConfig returns the defaults of every setting.
func DefaultConfig() Config {
	top := warehouseamqp.DefaultTopology()
	return Config{
		DatabaseURL:           "postgres://postgres@127.0.0.1:5432/warehouse?sslmode=disable",
		DatabaseMaxConns:      24,
		AMQPURL:               "amqp://guest:guest@127.0.0.1:5672/",
		HTTPAddr:              ":8090",
		RelayHTTPAddr:         ":8091",
		DBTimeout:             5 * time.Second,
		ShutdownTimeout:       20 * time.Second,
		BrokerDownGrace:       30 * time.Second,
		EventsExchange:        top.Exchange,
		DeadLetterExchange:    top.DeadLetterExchange,
		Queue:                 top.Queue,
		DeadLetterQueue:       top.DeadLetterQueue,
		QueueDeliveryLimit:    top.DeliveryLimit,
		ConsumerPrefetch:      32,
		ConsumerConcurrency:   8,
		ConsumerMaxDeliveries: 5,
		ConsumerRetryDelay:    time.Second,
		ConsumerMaxRetryDelay: 30 * time.Second,
		ConsumerMaxHold:       15 * time.Minute,
		InboxRetention:        7 * 24 * time.Hour,
		RelayPollInterval:     time.Second,
		RelayBatchSize:        100,
		RelayMaxAttempts:      10,
		RelayPublishTimeout:   30 * time.Second,
		RelayClaimTimeout:     35 * time.Second,
		RelayMaxMessageBytes:  16 << 20,
		OutboxRetention:       7 * 24 * time.Hour,
		LogFormat:             "json",
		LogLevel:              "info",
	}
}

// LoadConfig returns DefaultConfig overridden by the environment variables that are set,
// validated.
func LoadConfig() (Config, error) { return LoadConfigFrom(env.ToMap(os.Environ())) }

// LoadConfigFrom is LoadConfig reading the variables from environ instead of the process
// environment.
func LoadConfigFrom(environ map[string]string) (Config, error) {
	cfg := DefaultConfig()
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		return Config{}, fmt.Errorf("read configuration from the environment: %w", namedErrors(err))
	}
	return cfg, cfg.Validate()
}

// namedErrors names the environment variable in each of env's parse errors, which name the
// struct field.
func namedErrors(err error) error {
	agg, ok := errors.AsType[env.AggregateError](err)
	if !ok {
		return err
	}
	errs := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		if pe, ok := errors.AsType[env.ParseError](e); ok {
			if f, ok := reflect.TypeFor[Config]().FieldByName(pe.Name); ok {
				e = fmt.Errorf("%s: %w", f.Tag.Get("env"), pe.Err)
			}
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// Topology returns the broker names of cfg.
func (c Config) Topology() warehouseamqp.Topology {
	return warehouseamqp.Topology{
		Exchange:           c.EventsExchange,
		DeadLetterExchange: c.DeadLetterExchange,
		Queue:              c.Queue,
		DeadLetterQueue:    c.DeadLetterQueue,
		DeliveryLimit:      c.QueueDeliveryLimit,
	}
}

// Validate reports every setting that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("WAREHOUSE_DATABASE_URL is required"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("WAREHOUSE_AMQP_URL is required"))
	}
	if err := c.Topology().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DatabaseMaxConns < 4 {
		errs = append(errs, fmt.Errorf("WAREHOUSE_DATABASE_MAX_CONNS must be at least 4, is %d", c.DatabaseMaxConns))
	}
	if c.ConsumerConcurrency < 1 || c.ConsumerPrefetch < c.ConsumerConcurrency {
		errs = append(errs, fmt.Errorf("WAREHOUSE_CONSUMER_CONCURRENCY (%d) must be from 1 to WAREHOUSE_CONSUMER_PREFETCH (%d)",
			c.ConsumerConcurrency, c.ConsumerPrefetch))
	}
	if int(c.DatabaseMaxConns) < c.ConsumerConcurrency+3 {
		errs = append(errs, fmt.Errorf("WAREHOUSE_DATABASE_MAX_CONNS (%d) must exceed WAREHOUSE_CONSUMER_CONCURRENCY (%d) by at least 3 (relay and API)",
			c.DatabaseMaxConns, c.ConsumerConcurrency))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"WAREHOUSE_HTTP_DB_TIMEOUT", c.DBTimeout},
		{"WAREHOUSE_SHUTDOWN_TIMEOUT", c.ShutdownTimeout},
		{"WAREHOUSE_BROKER_DOWN_GRACE", c.BrokerDownGrace},
		{"WAREHOUSE_CONSUMER_RETRY_DELAY", c.ConsumerRetryDelay},
		{"WAREHOUSE_CONSUMER_MAX_RETRY_DELAY", c.ConsumerMaxRetryDelay},
		{"WAREHOUSE_CONSUMER_MAX_HOLD", c.ConsumerMaxHold},
		{"WAREHOUSE_RELAY_PUBLISH_TIMEOUT", c.RelayPublishTimeout},
		{"WAREHOUSE_INBOX_RETENTION", c.InboxRetention},
		{"WAREHOUSE_RELAY_POLL_INTERVAL", c.RelayPollInterval},
		{"WAREHOUSE_OUTBOX_RETENTION", c.OutboxRetention},
	} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, is %s", d.name, d.value))
		}
	}
	for _, n := range []struct {
		name  string
		value int
	}{
		{"WAREHOUSE_CONSUMER_MAX_DELIVERIES", c.ConsumerMaxDeliveries},
		{"WAREHOUSE_RELAY_BATCH_SIZE", c.RelayBatchSize},
		{"WAREHOUSE_RELAY_MAX_ATTEMPTS", c.RelayMaxAttempts},
		{"WAREHOUSE_RELAY_MAX_MESSAGE_BYTES", c.RelayMaxMessageBytes},
	} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("%s must be positive, is %d", n.name, n.value))
		}
	}
	if c.RelayClaimTimeout <= c.RelayPublishTimeout {
		errs = append(errs, fmt.Errorf("WAREHOUSE_RELAY_CLAIM_TIMEOUT (%s) must exceed WAREHOUSE_RELAY_PUBLISH_TIMEOUT (%s)",
			c.RelayClaimTimeout, c.RelayPublishTimeout))
	}
	if c.ConsumerMaxRetryDelay < c.ConsumerRetryDelay {
		errs = append(errs, fmt.Errorf("WAREHOUSE_CONSUMER_MAX_RETRY_DELAY (%s) must be at least WAREHOUSE_CONSUMER_RETRY_DELAY (%s)",
			c.ConsumerMaxRetryDelay, c.ConsumerRetryDelay))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

package app

import (
	"slices"
	"time"

	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/services/orders"
)

// Config is the whole configuration of the orders service, read once from the environment by
// LoadConfig (internal/envconfig: each variable and its default in the field's tags). The defaults work on a developer machine with PostgreSQL on 127.0.0.1:5432
// (user postgres, no password) and RabbitMQ on 127.0.0.1:5672 (guest/guest).
type Config struct {
	// DatabaseURL names the service's own database; it is created on first start.
	DatabaseURL string `env:"ORDERS_DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/orders?sslmode=disable"`
	// DatabaseMaxConns bounds the connection pool (API requests, consumer workers, the relay
	// and its LISTEN connection share it).
	DatabaseMaxConns int32 `env:"ORDERS_DATABASE_MAX_CONNS" envDefault:"10"`
	// DatabaseTimeout bounds the database work of one HTTP request and one connection
	// attempt; past it the API answers 503. At start-up an unreachable database is waited
	// for, with a log line per attempt, until the process is stopped.
	DatabaseTimeout time.Duration `env:"ORDERS_DATABASE_TIMEOUT" envDefault:"5s"`

	// The broker, the shop's exchanges, the queue's delivery limit and the grace of a lost
	// broker connection: internal/service BrokerEnv (ORDERS_AMQP_URL, …).
	service.BrokerEnv `env:"ORDERS_"`
	// The CA and the client certificate of the database connection: internal/service
	// DatabaseTLSEnv (ORDERS_DATABASE_CA_FILE, …).
	service.DatabaseTLSEnv `env:"ORDERS_"`
	// The queue of stock events and its dead letters (docs/events.md).
	Queue           string `env:"ORDERS_QUEUE" envDefault:"orders.stock"`
	DeadLetterQueue string `env:"ORDERS_DEAD_LETTER_QUEUE" envDefault:"orders.stock.dead"`
	// OrderCreatedVersion is the version of the OrderCreated events the API writes: 1, or 2
	// once every consumer reads version 2 (docs/events.md#changing-an-event). The version
	// is chosen when the event is written, so rows already in the outbox keep theirs.
	OrderCreatedVersion int `env:"ORDERS_ORDER_CREATED_VERSION" envDefault:"1"`

	// HTTPAddr is where the API listens (api and all).
	HTTPAddr string `env:"ORDERS_HTTP_ADDR" envDefault:":8080"`
	// OpsAddr is where the api and all processes serve /healthz, /readyz and /metrics on a
	// listener of their own (a port a scraper and the probes reach and the API's clients do
	// not). Empty (the default): the API's listener serves them. When set, the API's listener
	// keeps /healthz and /readyz but answers /metrics 404 (internal/service Listeners).
	OpsAddr string `env:"ORDERS_OPS_ADDR"`
	// RelayHTTPAddr is where the relay process serves /healthz, /readyz and /metrics.
	RelayHTTPAddr string `env:"ORDERS_RELAY_HTTP_ADDR" envDefault:":8081"`
	// HTTPShutdownTimeout is how long in-flight requests get to finish on shutdown.
	HTTPShutdownTimeout time.Duration `env:"ORDERS_HTTP_SHUTDOWN_TIMEOUT" envDefault:"10s"`

	// Consumer of the stock events (api and all): the settings both services share
	// (internal/service ConsumerEnv, ORDERS_CONSUMER_PREFETCH, …), the concurrency and the
	// batch size; documented on internal/service ConsumerSettings. Each stock event updates
	// its own order's row: batches of 8 commit once for 8 events (docs/benchmarks.md, item 9).
	service.ConsumerEnv     `env:"ORDERS_"`
	ConsumerConcurrency     int           `env:"ORDERS_CONSUMER_CONCURRENCY" envDefault:"4"`
	ConsumerBatchSize       int           `env:"ORDERS_CONSUMER_BATCH_SIZE" envDefault:"8"`
	ConsumerShutdownTimeout time.Duration `env:"ORDERS_CONSUMER_SHUTDOWN_TIMEOUT" envDefault:"10s"`

	// Outbox relay (relay and all): internal/service RelayEnv (ORDERS_RELAY_BATCH_SIZE, …),
	// documented on internal/service RelaySettings.
	service.RelayEnv `env:"ORDERS_"`

	// Retention of published outbox rows, cleaned by the relay process.
	OutboxRetention       time.Duration `env:"ORDERS_OUTBOX_RETENTION" envDefault:"168h"`
	OutboxCleanupInterval time.Duration `env:"ORDERS_OUTBOX_CLEANUP_INTERVAL" envDefault:"1m"`
	// Retention of processed inbox rows, cleaned by the api process. Must exceed the longest
	// redelivery window (see pkg/inbox).
	InboxRetention       time.Duration `env:"ORDERS_INBOX_RETENTION" envDefault:"336h"`
	InboxCleanupInterval time.Duration `env:"ORDERS_INBOX_CLEANUP_INTERVAL" envDefault:"10m"`
	// Retention of idempotency keys, cleaned by the api process: a retry after it creates a
	// new order.
	IdempotencyKeyRetention       time.Duration `env:"ORDERS_IDEMPOTENCY_KEY_RETENTION" envDefault:"24h"`
	IdempotencyKeyCleanupInterval time.Duration `env:"ORDERS_IDEMPOTENCY_KEY_CLEANUP_INTERVAL" envDefault:"10m"`

	// LogFormat is json or text; LogLevel debug, info, warn or error.
	LogFormat string `env:"ORDERS_LOG_FORMAT" envDefault:"json"`
	LogLevel  string `env:"ORDERS_LOG_LEVEL" envDefault:"info"`
}

// LoadConfig is LoadConfigFrom(nil): the process environment.
func LoadConfig() (Config, error) { return LoadConfigFrom(nil) }

// LoadConfigFrom reads the variables of environ over the defaults (an unset or empty one
// keeps its default) and validates the result; cmd/orders's tests pass their own.
func LoadConfigFrom(environ map[string]string) (Config, error) {
	return envconfig.LoadValid[Config](environ)
}

// DefaultConfig returns the configuration with every default and nothing from the
// environment, for tests and embedding.
func DefaultConfig() Config { return envconfig.Defaults[Config]() }

// Validate reports every missing or out-of-range setting.
func (c Config) Validate() error {
	var v envconfig.Checks
	check := v.Check
	check(c.DatabaseURL != "", "ORDERS_DATABASE_URL is empty")
	c.BrokerEnv.Check(&v, "ORDERS_")
	c.DatabaseTLSEnv.Check(&v, "ORDERS_", c.DatabaseURL)
	check(c.DatabaseMaxConns >= 2, "ORDERS_DATABASE_MAX_CONNS must be at least 2, got %d", c.DatabaseMaxConns)
	check(c.DatabaseTimeout > 0, "ORDERS_DATABASE_TIMEOUT must be positive")
	check(c.Queue != "" && c.DeadLetterQueue != "", "ORDERS_QUEUE and ORDERS_DEAD_LETTER_QUEUE are required")
	check(slices.Contains(orders.OrderCreatedVersions(), c.OrderCreatedVersion), "ORDERS_ORDER_CREATED_VERSION must be one of %v, is %d",
		orders.OrderCreatedVersions(), c.OrderCreatedVersion)
	c.ConsumerEnv.Check(&v, "ORDERS_", c.ConsumerConcurrency, c.ConsumerBatchSize)
	check(c.ConsumerShutdownTimeout > 0, "ORDERS_CONSUMER_SHUTDOWN_TIMEOUT must be positive")
	c.RelayEnv.Check(&v, "ORDERS_")
	check(c.OutboxRetention > 0 && c.OutboxCleanupInterval > 0, "ORDERS_OUTBOX_RETENTION and ORDERS_OUTBOX_CLEANUP_INTERVAL must be positive")
	check(c.InboxRetention > 0 && c.InboxCleanupInterval > 0, "ORDERS_INBOX_RETENTION and ORDERS_INBOX_CLEANUP_INTERVAL must be positive")
	check(c.IdempotencyKeyRetention > 0 && c.IdempotencyKeyCleanupInterval > 0,
		"ORDERS_IDEMPOTENCY_KEY_RETENTION and ORDERS_IDEMPOTENCY_KEY_CLEANUP_INTERVAL must be positive")
	check(c.HTTPShutdownTimeout > 0, "ORDERS_HTTP_SHUTDOWN_TIMEOUT must be positive")
	service.CheckOpsAddr(&v, "ORDERS_", c.HTTPAddr, c.OpsAddr)
	return v.Err()
}

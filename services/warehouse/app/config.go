package app

import (
	"fmt"
	"slices"
	"time"

	"github.com/outboxshop/outboxshop/internal/bearer"
	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/services/warehouse"

	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
)

// Config is the warehouse's configuration, read once from the environment by [LoadConfig]
// (internal/envconfig: each variable and its default in the field's tags). The defaults work
// on a developer machine with PostgreSQL on 127.0.0.1:5432 and RabbitMQ on 127.0.0.1:5672.
type Config struct {
	// DatabaseURL is the warehouse's own database; it is created when missing.
	DatabaseURL string `env:"WAREHOUSE_DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/warehouse?sslmode=disable"`
	// DatabaseMaxConns bounds the pool: the consumer uses up to ConsumerConcurrency
	// connections, the relay one per batch in flight and one more, the API the rest.
	DatabaseMaxConns int32 `env:"WAREHOUSE_DATABASE_MAX_CONNS" envDefault:"24"`

	// HTTPAddr is where `api` and `all` serve the API, /healthz and /readyz, and /metrics
	// unless OpsAddr is set.
	HTTPAddr string `env:"WAREHOUSE_HTTP_ADDR" envDefault:":8090"`
	// OpsAddr is where `api` and `all` serve /healthz, /readyz and /metrics on a listener of
	// their own (a port a scraper and the probes reach and the API's clients do not). Empty
	// (the default): HTTPAddr serves them. When set, HTTPAddr keeps /healthz and /readyz but
	// answers /metrics 404 (internal/service Listeners).
	OpsAddr string `env:"WAREHOUSE_OPS_ADDR"`
	// RelayHTTPAddr is where `relay` serves /healthz, /readyz and /metrics.
	RelayHTTPAddr string `env:"WAREHOUSE_RELAY_HTTP_ADDR" envDefault:":8091"`
	// DBTimeout bounds the database work of one HTTP request, and one attempt to connect.
	DBTimeout time.Duration `env:"WAREHOUSE_HTTP_DB_TIMEOUT" envDefault:"5s"`
	// ShutdownTimeout bounds a graceful stop: in-flight requests and messages get this long.
	ShutdownTimeout time.Duration `env:"WAREHOUSE_SHUTDOWN_TIMEOUT" envDefault:"20s"`

	// The broker, the shop's exchanges, the queue's delivery limit and the grace of a lost
	// broker connection: internal/service BrokerEnv (WAREHOUSE_AMQP_URL, …).
	service.BrokerEnv `env:"WAREHOUSE_"`
	// The CA and the client certificate of the database connection: internal/service
	// DatabaseTLSEnv (WAREHOUSE_DATABASE_CA_FILE, …).
	service.DatabaseTLSEnv `env:"WAREHOUSE_"`
	// The queue of order events and its dead letters (docs/events.md).
	Queue           string `env:"WAREHOUSE_QUEUE" envDefault:"warehouse.orders"`
	DeadLetterQueue string `env:"WAREHOUSE_DEAD_LETTER_QUEUE" envDefault:"warehouse.orders.dead"`

	// Consumer tuning: the settings both services share (internal/service ConsumerEnv,
	// WAREHOUSE_CONSUMER_PREFETCH, …), the concurrency and the batch size; documented on
	// internal/service ConsumerSettings. A transaction per order: orders go to a few hot
	// SKUs, whose row locks a batch holds until its commit, and batches of the hot five
	// drained no faster than single orders (docs/benchmarks.md, item 9).
	service.ConsumerEnv `env:"WAREHOUSE_"`
	ConsumerConcurrency int `env:"WAREHOUSE_CONSUMER_CONCURRENCY" envDefault:"8"`
	ConsumerBatchSize   int `env:"WAREHOUSE_CONSUMER_BATCH_SIZE" envDefault:"1"`
	// InboxRetention is how long processed message ids are remembered. It must exceed the
	// longest time in which a duplicate can still arrive.
	InboxRetention time.Duration `env:"WAREHOUSE_INBOX_RETENTION" envDefault:"168h"`
	// OrderCreatedVersions are the versions of OrderCreated the consumer reads, separated by
	// commas; one it does not read is dead-lettered with the reason. The default is every
	// version this release reads (warehouse.OrderCreatedVersions): drop one only when none
	// can arrive any more (docs/events.md#changing-an-event).
	OrderCreatedVersions []int `env:"WAREHOUSE_ORDER_CREATED_VERSIONS" envDefault:"1,2"`

	// Relay tuning: internal/service RelayEnv (WAREHOUSE_RELAY_BATCH_SIZE, …), documented on
	// internal/service RelaySettings.
	service.RelayEnv `env:"WAREHOUSE_"`
	// OutboxRetention is how long published outbox rows are kept.
	OutboxRetention time.Duration `env:"WAREHOUSE_OUTBOX_RETENTION" envDefault:"168h"`

	// AdminToken opens the admin routes of the API (PUT /stock/{sku}): a request must send
	// it as Authorization: Bearer (services/warehouse/http). At least 16 bytes of letters,
	// digits and - . _ ~ + /. Unset, with AdminTokenFile unset too, the admin routes answer
	// 403: the admin API is closed until an operator opens it. An envconfig.Secret: it never
	// shows in a log line or an error.
	AdminToken envconfig.Secret `env:"WAREHOUSE_ADMIN_TOKEN"`
	// AdminTokenFile names a file holding the admin token instead (a mounted Kubernetes
	// Secret, a compose secret: the *_FILE convention of the official images), its trailing
	// newlines trimmed. Setting both is an error; so is a file that cannot be read or is empty.
	AdminTokenFile string `env:"WAREHOUSE_ADMIN_TOKEN_FILE"`

	// LogFormat is json or text; LogLevel debug, info, warn or error.
	LogFormat string `env:"WAREHOUSE_LOG_FORMAT" envDefault:"json"`
	LogLevel  string `env:"WAREHOUSE_LOG_LEVEL" envDefault:"info"`
}

// DefaultConfig is the configuration of the tags' defaults alone (envconfig.Defaults).
func DefaultConfig() Config { return envconfig.Defaults[Config]() }

// LoadConfig is LoadConfigFrom(nil): the process environment.
func LoadConfig() (Config, error) { return LoadConfigFrom(nil) }

// LoadConfigFrom reads the variables of environ over the defaults (an unset or empty one
// keeps its default) and validates the result; cmd/warehouse's tests pass their own.
func LoadConfigFrom(environ map[string]string) (Config, error) {
	return envconfig.LoadValid[Config](environ)
}

// Topology returns the broker names of cfg.
func (c Config) Topology() warehouseamqp.Topology {
	return warehouseamqp.Topology(c.Names(c.Queue, c.DeadLetterQueue))
}

// Validate reports every setting that cannot work.
func (c Config) Validate() error {
	var v envconfig.Checks
	v.Check(c.DatabaseURL != "", "WAREHOUSE_DATABASE_URL is required")
	c.BrokerEnv.Check(&v, "WAREHOUSE_")
	c.DatabaseTLSEnv.Check(&v, "WAREHOUSE_", c.DatabaseURL)
	v.Check(c.Queue != "" && c.DeadLetterQueue != "", "WAREHOUSE_QUEUE and WAREHOUSE_DEAD_LETTER_QUEUE are required")
	v.Check(c.DatabaseMaxConns >= 4, "WAREHOUSE_DATABASE_MAX_CONNS must be at least 4, is %d", c.DatabaseMaxConns)
	c.ConsumerEnv.Check(&v, "WAREHOUSE_", c.ConsumerConcurrency, c.ConsumerBatchSize)
	// An order of several lines takes its stock under a savepoint; in a batch run again with
	// a savepoint per message, that is two subtransactions per order, and a backend caches
	// the ids of at most inbox.MaxBatch of them before every snapshot in the database pays.
	v.Check(c.ConsumerBatchSize <= inbox.MaxBatch/2, "WAREHOUSE_CONSUMER_BATCH_SIZE must be at most %d (an order may take two subtransactions of a batch), is %d",
		inbox.MaxBatch/2, c.ConsumerBatchSize)
	c.RelayEnv.Check(&v, "WAREHOUSE_")
	v.Check(len(c.OrderCreatedVersions) > 0, "WAREHOUSE_ORDER_CREATED_VERSIONS must name at least one version")
	for i, ver := range c.OrderCreatedVersions {
		v.Check(slices.Contains(warehouse.OrderCreatedVersions(), ver), "WAREHOUSE_ORDER_CREATED_VERSIONS: this warehouse reads versions %v of OrderCreated, not %d",
			warehouse.OrderCreatedVersions(), ver)
		v.Check(!slices.Contains(c.OrderCreatedVersions[:i], ver), "WAREHOUSE_ORDER_CREATED_VERSIONS names version %d twice", ver)
	}
	v.Check(int(c.DatabaseMaxConns) >= c.ConsumerConcurrency+c.RelayConnections()+1,
		"WAREHOUSE_DATABASE_MAX_CONNS (%d) must exceed WAREHOUSE_CONSUMER_CONCURRENCY (%d) by at least %d: the relay's connections (WAREHOUSE_RELAY_IN_FLIGHT_BATCHES + 1, or 2 × WAREHOUSE_RELAY_IN_FLIGHT_BATCHES + 2 in mode wal) and the API's",
		c.DatabaseMaxConns, c.ConsumerConcurrency, c.RelayConnections()+1)
	service.CheckOpsAddr(&v, "WAREHOUSE_", c.HTTPAddr, c.OpsAddr)
	_, err := c.ResolveAdminToken()
	v.Add(err)
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"WAREHOUSE_HTTP_DB_TIMEOUT", c.DBTimeout},
		{"WAREHOUSE_SHUTDOWN_TIMEOUT", c.ShutdownTimeout},
		{"WAREHOUSE_INBOX_RETENTION", c.InboxRetention},
		{"WAREHOUSE_OUTBOX_RETENTION", c.OutboxRetention},
	} {
		v.Check(d.value > 0, "%s must be positive, is %s", d.name, d.value)
	}
	return v.Err()
}

// ResolveAdminToken returns the admin token: WAREHOUSE_ADMIN_TOKEN, or the content of the
// file WAREHOUSE_ADMIN_TOKEN_FILE names (envconfig.SecretFromFile), checked by bearer.Check;
// "" when neither is set (the admin API is disabled). Errors name the variable and the file,
// never the token.
func (c Config) ResolveAdminToken() (envconfig.Secret, error) {
	token, err := envconfig.SecretFromFile(c.AdminToken, "WAREHOUSE_ADMIN_TOKEN", c.AdminTokenFile, "WAREHOUSE_ADMIN_TOKEN_FILE")
	if err != nil || token == "" {
		return "", err
	}
	if err := bearer.Check(token.Reveal()); err != nil {
		if c.AdminTokenFile != "" {
			return "", fmt.Errorf("WAREHOUSE_ADMIN_TOKEN_FILE: the token in %s %w", c.AdminTokenFile, err)
		}
		return "", fmt.Errorf("WAREHOUSE_ADMIN_TOKEN %w", err)
	}
	return token, nil
}

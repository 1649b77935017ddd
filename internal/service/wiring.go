package service

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/httpserver"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/redact"
	"github.com/outboxshop/outboxshop/internal/tlsfiles"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// Addr is ln's address ("127.0.0.1:43127"), or "" for a nil ln (a listener the mode does
// not open).
func Addr(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// NewRegistry returns a metrics registry with the Go and process collectors: what /metrics
// of every process serves, besides the metrics of what it runs.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// ConstLabels are the labels of every metric of a service's own and of the libraries'
// (docs/metrics.md): service="orders", service="warehouse".
func ConstLabels(service string) prometheus.Labels { return prometheus.Labels{"service": service} }

// The relay's backoff between the attempts of a failed row: pkg/outbox's defaults, set
// explicitly so that [RedeliveryWindow] is computed from what the relay runs with.
const (
	RelayRetryBaseDelay = time.Second
	RelayRetryMaxDelay  = 5 * time.Minute
)

// BrokerEnv are the broker variables whose defaults both services share, embedded in each
// service's Config under its prefix as [RelayEnv] is: the broker, the shop's exchanges
// (docs/events.md), the queue's delivery limit, and the grace of a lost broker connection.
// The queue names, which differ, are each Config's own Queue and DeadLetterQueue fields;
// [BrokerEnv.Names] puts them together.
type BrokerEnv struct {
	// AMQPURL is the RabbitMQ broker, or the nodes of a cluster separated by commas
	// ("amqp://u:p@mq-0:5672/,amqp://u:p@mq-1:5672/"); a comma inside credentials is
	// written %2C. The relay's publisher and the consumer connect to the nodes in turn from a
	// random one, and to the next one when a node fails ([BrokerEnv.AMQPURLs]).
	AMQPURL string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	// EventsExchange and DeadLetterExchange are the shop's exchanges (docs/events.md).
	EventsExchange     string `env:"EVENTS_EXCHANGE" envDefault:"shop.events"`
	DeadLetterExchange string `env:"DEAD_LETTER_EXCHANGE" envDefault:"shop.dlx"`
	// QueueDeliveryLimit is the quorum queue's x-delivery-limit, set when the queue is
	// declared. A queue that exists with another one keeps it, with a warning in the log
	// (docs/events.md).
	QueueDeliveryLimit int `env:"QUEUE_DELIVERY_LIMIT" envDefault:"20"`
	// QueueReplicas is the x-quorum-initial-group-size of the service's queue and of its
	// dead-letter queue, set when they are declared: how many nodes of a cluster hold a
	// replica. 0 leaves it to the broker, a replica on every node.
	QueueReplicas int `env:"QUEUE_REPLICAS" envDefault:"0"`
	// BrokerDownGrace is how long the consumer, or the relay, may be cut off from the broker
	// before /readyz answers 503.
	BrokerDownGrace time.Duration `env:"BROKER_DOWN_GRACE" envDefault:"30s"`
	// AMQPCAFile is the PEM file of the CA that signs the brokers' certificates, trusted
	// instead of the system's roots; AMQPCertFile and AMQPKeyFile a client certificate and its
	// key, for a broker that asks for one (internal/tlsfiles). With any of them, every URL of
	// AMQPURL must be amqps://. They are read at start: restart after rotating them.
	AMQPCAFile   string `env:"AMQP_CA_FILE"`
	AMQPCertFile string `env:"AMQP_CERT_FILE"`
	AMQPKeyFile  string `env:"AMQP_KEY_FILE"`
}

// AMQPTLS returns the TLS configuration of the amqps:// URLs that the TLS files give, or nil
// when none is set (an amqps:// URL then trusts the system's roots). prefix names the
// variables in errors ("ORDERS_").
func (e BrokerEnv) AMQPTLS(prefix string) (*tls.Config, error) {
	return tlsfiles.Files{CA: e.AMQPCAFile, Cert: e.AMQPCertFile, Key: e.AMQPKeyFile}.Config(tlsfiles.NamesOf(prefix + "AMQP_"))
}

// Names returns the topology of e with the service's queue and dead-letter queue.
func (e BrokerEnv) Names(queue, deadLetterQueue string) amqptopo.Names {
	return amqptopo.Names{
		Exchange: e.EventsExchange, DeadLetterExchange: e.DeadLetterExchange,
		Queue: queue, DeadLetterQueue: deadLetterQueue, DeliveryLimit: e.QueueDeliveryLimit, Replicas: e.QueueReplicas,
	}
}

// AMQPURLs returns the URLs of AMQPURL, split at its commas (spaces around them trimmed).
func (e BrokerEnv) AMQPURLs() []string {
	urls := strings.Split(e.AMQPURL, ",")
	for i, u := range urls {
		urls[i] = strings.TrimSpace(u)
	}
	return urls
}

// Check records in v every broker setting that cannot work, by its variable's name.
func (e BrokerEnv) Check(v *envconfig.Checks, prefix string) {
	v.Check(e.AMQPURL != "", "%sAMQP_URL is required", prefix)
	if e.AMQPURL != "" {
		urls := e.AMQPURLs()
		for i, u := range urls {
			_, err := amqp.ParseURI(u)
			// The URL may hold a password: name it by its place in the list, and quote
			// nothing of it (a password written without its percent-encoding is what a
			// parser quotes).
			err = redact.URLError(err)
			v.Check(err == nil, "%sAMQP_URL: URL %d of %d is not an amqp:// or amqps:// URL (%v); separate the URLs of several nodes "+
				"with commas, and write a comma inside a user name or password as %%2C", prefix, i+1, len(urls), err)
		}
	}
	tlsConf, err := e.AMQPTLS(prefix)
	v.Check(err == nil, "%v", err)
	if tlsConf != nil {
		for i, u := range e.AMQPURLs() {
			uri, err := amqp.ParseURI(u)
			if err != nil {
				continue // reported above
			}
			v.Check(uri.Scheme == "amqps", "%[1]sAMQP_URL: URL %[2]d of %[3]d is amqp://, and %[1]sAMQP_CA_FILE, %[1]sAMQP_CERT_FILE or "+
				"%[1]sAMQP_KEY_FILE is set: use amqps://", prefix, i+1, len(e.AMQPURLs()))
			v.Check(uri.CACertFile == "" && uri.CertFile == "" && uri.KeyFile == "" && uri.ServerName == "",
				"%[1]sAMQP_URL: URL %[2]d of %[3]d has TLS parameters (cacertfile, certfile, keyfile or server_name_indication), "+
					"and %[1]sAMQP_CA_FILE, %[1]sAMQP_CERT_FILE or %[1]sAMQP_KEY_FILE is set: give them in the settings alone", prefix, i+1, len(e.AMQPURLs()))
		}
	}
	v.Check(e.QueueReplicas >= 0, "%sQUEUE_REPLICAS must be positive, or 0 for the broker's default (a replica on every node), is %d",
		prefix, e.QueueReplicas)
	v.Check(e.EventsExchange != "" && e.DeadLetterExchange != "", "%[1]sEVENTS_EXCHANGE and %[1]sDEAD_LETTER_EXCHANGE are required", prefix)
	v.Check(e.QueueDeliveryLimit > 0, "%sQUEUE_DELIVERY_LIMIT must be positive, is %d", prefix, e.QueueDeliveryLimit)
	v.Check(e.BrokerDownGrace > 0, "%sBROKER_DOWN_GRACE must be positive, is %s", prefix, e.BrokerDownGrace)
}

// DatabaseTLSEnv are the TLS files of the database connection, embedded in each service's
// Config under its prefix as [BrokerEnv] is (ORDERS_DATABASE_CA_FILE, …): the PEM file of
// the CA that signs the server's certificate, and a client certificate and its key, for a
// server that asks for one. With any of them the database URL must be a postgres:// URL that
// says sslmode=verify-full (pgdb.WithTLSFiles adds them to it as sslrootcert, sslcert and
// sslkey). They are read at start: restart after rotating them.
type DatabaseTLSEnv struct {
	DatabaseCAFile   string `env:"DATABASE_CA_FILE"`
	DatabaseCertFile string `env:"DATABASE_CERT_FILE"`
	DatabaseKeyFile  string `env:"DATABASE_KEY_FILE"`
}

// DatabaseTLSFiles returns the files of e.
func (e DatabaseTLSEnv) DatabaseTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: e.DatabaseCAFile, Cert: e.DatabaseCertFile, Key: e.DatabaseKeyFile}
}

// Check records in v what cannot work in the files of e with the database URL dbURL, by the
// variables' names (prefix, such as "ORDERS_", then DATABASE_…).
func (e DatabaseTLSEnv) Check(v *envconfig.Checks, prefix, dbURL string) {
	f := e.DatabaseTLSFiles()
	if !f.Set() {
		return
	}
	_, err := f.Config(tlsfiles.NamesOf(prefix + "DATABASE_"))
	v.Check(err == nil, "%v", err)
	_, err = pgdb.WithTLSFiles(dbURL, f, prefix+"DATABASE_")
	v.Check(err == nil, "%v", err)
}

// BrokerTLS returns the TLS configuration of broker's amqps:// URLs (nil when its TLS files
// are not set), once [CheckBrokerTLS] found that no broker refuses it, for the declarer,
// the consumer, the relay's publisher and the dead-letters subcommand alike. prefix names
// the variables ("ORDERS_").
func BrokerTLS(ctx context.Context, broker BrokerEnv, prefix string) (*tls.Config, error) {
	tlsConf, err := broker.AMQPTLS(prefix)
	if err != nil || tlsConf == nil {
		// Without the settings, an amqps:// URL is amqp091-go's to check, with the files
		// its own parameters may name (cacertfile, …), which this check would not know.
		return nil, err
	}
	if err := CheckBrokerTLS(ctx, broker.AMQPURLs(), tlsConf, amqptopo.DefaultDialTimeout, prefix); err != nil {
		return nil, err
	}
	return tlsConf, nil
}

// CheckBrokerTLS connects to each amqps:// URL of urls with tlsConf (its ServerName the
// URL's host) and returns an error naming the settings when a broker's certificate is
// refused, or the broker refuses the client's: a wrong CA file, a host name the
// certificate does not name, a missing client certificate, a port that does not take TLS. It goes as far as the broker's
// first AMQP frame, which comes only after the broker accepted the client's certificate. A
// broker that does not answer within timeout is not an error here: the consumer and the
// relay wait for it, as they do at any time. prefix names the variables ("ORDERS_").
func CheckBrokerTLS(ctx context.Context, urls []string, tlsConf *tls.Config, timeout time.Duration, prefix string) error {
	for i, u := range urls {
		uri, err := amqp.ParseURI(u)
		if err != nil || uri.Scheme != "amqps" {
			continue
		}
		addr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
		if refused, err := handshake(ctx, addr, uri.Host, tlsConf, timeout); refused {
			return fmt.Errorf("%[1]sAMQP_URL: URL %[2]d of %[3]d (%[4]s): the TLS handshake failed; check that the port takes TLS, "+
				"that %[1]sAMQP_CA_FILE is the CA that signed the broker's certificate, that the certificate names %[5]q, and that "+
				"%[1]sAMQP_CERT_FILE and %[1]sAMQP_KEY_FILE are a client certificate the broker accepts: %[6]w",
				prefix, i+1, len(urls), addr, uri.Host, err)
		}
	}
	return nil
}

// handshake does the TLS handshake with the broker at addr, sends the AMQP protocol header
// and reads the first byte of the answer: a broker that refuses the client's certificate
// says so with an alert by then. It reports whether the handshake failed on a certificate,
// or on a port without TLS (tlsfiles.Refused).
//
// The broker closes the connection after its alert, and the header written meanwhile may
// make its kernel answer with a reset, which can reach the client before the alert is read
// (ECONNRESET instead of "certificate required"). So when the broker asked for a client
// certificate the client does not have, and the connection then ended (not by a timeout),
// a second attempt tells a refusal from a broker that went down at that moment: one that
// ends the same way again refused the client; a broker that is going down does not get as
// far as asking.
func handshake(ctx context.Context, addr, host string, tlsConf *tls.Config, timeout time.Duration) (refused bool, err error) {
	for attempt := 1; ; attempt++ {
		asked, err := handshakeOnce(ctx, addr, host, tlsConf, timeout)
		switch {
		case tlsfiles.Refused(err):
			return true, err
		case err == nil || !asked || timedOut(err) || ctx.Err() != nil:
			return false, err
		case attempt == 2:
			return true, fmt.Errorf("the broker asks for a client certificate, and none is set: %w", err)
		}
		t := time.NewTimer(200 * time.Millisecond) // a broker going down, its port closed by then
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false, err
		}
	}
}

// handshakeOnce is one attempt of handshake: it returns whether the broker asked for a
// client certificate that the client does not have, and how the attempt ended.
func handshakeOnce(ctx context.Context, addr, host string, tlsConf *tls.Config, timeout time.Duration) (asked bool, err error) {
	c := tlsConf.Clone()
	if c == nil {
		c = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.ServerName == "" {
		c.ServerName = host
	}
	var missing atomic.Bool
	certs := c.Certificates
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if len(certs) == 0 {
			missing.Store(true)
			return &tls.Certificate{}, nil
		}
		return &certs[0], nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{Config: c}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return missing.Load(), err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err = conn.Write([]byte("AMQP\x00\x00\x09\x01")); err == nil {
		_, err = conn.Read(make([]byte, 1))
	}
	return missing.Load(), err
}

// timedOut reports whether err is a deadline that passed: a broker slow to answer, never a
// refusal.
func timedOut(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// RelayEnv are the relay's variables, the same in both services: each service's Config
// embeds it under its prefix (service.RelayEnv `env:"ORDERS_"` reads ORDERS_RELAY_BATCH_SIZE),
// and hands the relay its [RelaySettings] with envconfig.Section(cfg, "Relay"). The fields
// are documented on RelaySettings.
type RelayEnv struct {
	RelayMode            string        `env:"RELAY_MODE" envDefault:"poll"`
	RelayBatchSize       int           `env:"RELAY_BATCH_SIZE" envDefault:"100"`
	RelayPollInterval    time.Duration `env:"RELAY_POLL_INTERVAL" envDefault:"1s"`
	RelayMaxAttempts     int           `env:"RELAY_MAX_ATTEMPTS" envDefault:"10"`
	RelayPublishTimeout  time.Duration `env:"RELAY_PUBLISH_TIMEOUT" envDefault:"30s"`
	RelayClaimTimeout    time.Duration `env:"RELAY_CLAIM_TIMEOUT" envDefault:"35s"`
	RelayMaxMessageBytes int           `env:"RELAY_MAX_MESSAGE_BYTES" envDefault:"16777216"`
	RelayInFlightBatches int           `env:"RELAY_IN_FLIGHT_BATCHES" envDefault:"2"`
}

// Check records in v every relay setting that cannot work, by its variable's name
// (prefix, such as "ORDERS_", then RELAY_…).
func (e RelayEnv) Check(v *envconfig.Checks, prefix string) {
	v.Check(e.RelayMode == RelayModePoll || e.RelayMode == RelayModeWAL, "%sRELAY_MODE must be %q or %q, is %q",
		prefix, RelayModePoll, RelayModeWAL, e.RelayMode)
	v.Check(e.RelayBatchSize > 0, "%sRELAY_BATCH_SIZE must be positive, is %d", prefix, e.RelayBatchSize)
	v.Check(e.RelayPollInterval > 0, "%sRELAY_POLL_INTERVAL must be positive, is %s", prefix, e.RelayPollInterval)
	v.Check(e.RelayMaxAttempts > 0, "%sRELAY_MAX_ATTEMPTS must be positive, is %d", prefix, e.RelayMaxAttempts)
	v.Check(e.RelayPublishTimeout > 0, "%sRELAY_PUBLISH_TIMEOUT must be positive, is %s", prefix, e.RelayPublishTimeout)
	v.Check(e.RelayClaimTimeout > e.RelayPublishTimeout, "%[1]sRELAY_CLAIM_TIMEOUT (%[2]s) must exceed %[1]sRELAY_PUBLISH_TIMEOUT (%[3]s)",
		prefix, e.RelayClaimTimeout, e.RelayPublishTimeout)
	v.Check(e.RelayMaxMessageBytes > 0, "%sRELAY_MAX_MESSAGE_BYTES must be positive, is %d", prefix, e.RelayMaxMessageBytes)
	v.Check(e.RelayInFlightBatches >= 1 && e.RelayInFlightBatches <= outbox.MaxInFlightBatches,
		"%sRELAY_IN_FLIGHT_BATCHES must be between 1 and %d, is %d", prefix, outbox.MaxInFlightBatches, e.RelayInFlightBatches)
}

// RelayConnections is how many connections of its pool the relay of these settings may hold
// at once (outbox.Relay.PoolSize, outbox.WALRelay.PoolSize).
func (e RelayEnv) RelayConnections() int {
	if e.RelayMode == RelayModeWAL {
		return 2*e.RelayInFlightBatches + 2
	}
	return e.RelayInFlightBatches + 1
}

// ConsumerEnv are the consumer's variables with the same defaults in both services, embedded
// in each service's Config under its prefix as [RelayEnv] is. The concurrency and the batch
// size, whose defaults differ between the services (4 and 8; 8 and 1), are each Config's own
// ConsumerConcurrency and ConsumerBatchSize fields;
// envconfig.Section(cfg, "Consumer") reads all of them into [ConsumerSettings], where the
// fields are documented.
type ConsumerEnv struct {
	ConsumerPrefetch       int           `env:"CONSUMER_PREFETCH" envDefault:"32"`
	ConsumerMaxDeliveries  int           `env:"CONSUMER_MAX_DELIVERIES" envDefault:"5"`
	ConsumerRetryBaseDelay time.Duration `env:"CONSUMER_RETRY_DELAY" envDefault:"1s"`
	ConsumerRetryMaxDelay  time.Duration `env:"CONSUMER_MAX_RETRY_DELAY" envDefault:"30s"`
	ConsumerMaxHold        time.Duration `env:"CONSUMER_MAX_HOLD" envDefault:"15m"`
	ConsumerAckEvery       int           `env:"CONSUMER_ACK_EVERY" envDefault:"0"`
	ConsumerBatchWait      time.Duration `env:"CONSUMER_BATCH_WAIT" envDefault:"1ms"`
}

// Check records in v every consumer setting that cannot work, by its variable's name;
// concurrency and batch are the service's <prefix>CONSUMER_CONCURRENCY and
// <prefix>CONSUMER_BATCH_SIZE.
func (e ConsumerEnv) Check(v *envconfig.Checks, prefix string, concurrency, batch int) {
	v.Check(e.ConsumerPrefetch > 0 && e.ConsumerPrefetch <= 65535, "%sCONSUMER_PREFETCH must be 1..65535, is %d", prefix, e.ConsumerPrefetch)
	v.Check(concurrency > 0 && concurrency <= e.ConsumerPrefetch, "%[1]sCONSUMER_CONCURRENCY (%[2]d) must be from 1 to %[1]sCONSUMER_PREFETCH (%[3]d)",
		prefix, concurrency, e.ConsumerPrefetch)
	v.Check(e.ConsumerMaxDeliveries > 0, "%sCONSUMER_MAX_DELIVERIES must be positive, is %d", prefix, e.ConsumerMaxDeliveries)
	v.Check(e.ConsumerRetryBaseDelay > 0, "%sCONSUMER_RETRY_DELAY must be positive, is %s", prefix, e.ConsumerRetryBaseDelay)
	v.Check(e.ConsumerRetryMaxDelay >= e.ConsumerRetryBaseDelay, "%[1]sCONSUMER_MAX_RETRY_DELAY (%[2]s) must be at least %[1]sCONSUMER_RETRY_DELAY (%[3]s)",
		prefix, e.ConsumerRetryMaxDelay, e.ConsumerRetryBaseDelay)
	v.Check(e.ConsumerMaxHold > 0, "%sCONSUMER_MAX_HOLD must be positive, is %s", prefix, e.ConsumerMaxHold)
	v.Check(batch >= 1 && batch <= min(inbox.MaxBatch, e.ConsumerPrefetch), "%[1]sCONSUMER_BATCH_SIZE (%[2]d) must be from 1 to %[1]sCONSUMER_PREFETCH (%[3]d), at most %[4]d",
		prefix, batch, e.ConsumerPrefetch, inbox.MaxBatch)
	v.Check(e.ConsumerBatchWait >= 0, "%sCONSUMER_BATCH_WAIT must not be negative, is %s", prefix, e.ConsumerBatchWait)
	v.Check(e.ConsumerAckEvery >= 0 && e.ConsumerAckEvery <= e.ConsumerPrefetch, "%[1]sCONSUMER_ACK_EVERY (%[2]d) must be from 0 (the library's default) to %[1]sCONSUMER_PREFETCH (%[3]d)",
		prefix, e.ConsumerAckEvery, e.ConsumerPrefetch)
}

// RelaySettings are the outbox relay's settings, the same variables in both services
// (<SERVICE>_RELAY_*, [RelayEnv] in their Config, read with envconfig.Section).
type RelaySettings struct {
	// Mode is the relay: [RelayModePoll] (outbox.Relay) or [RelayModeWAL] (outbox.WALRelay,
	// which reads the outbox's inserts from a replication slot and needs the database at
	// wal_level = logical and a role with REPLICATION). Empty: poll.
	Mode string
	// BatchSize bounds the rows one cycle claims; PollInterval is the wait between cycles
	// when no notification comes; MaxAttempts is the publishes a row gets before it is dead.
	BatchSize    int
	PollInterval time.Duration
	MaxAttempts  int
	// PublishTimeout bounds every step of a batch's publish; ClaimTimeout is the longest a
	// paused or hung relay holds its claimed rows before PostgreSQL ends its transaction
	// (pkg/outbox Config.ClaimTimeout; must exceed the publish timeout).
	PublishTimeout time.Duration
	ClaimTimeout   time.Duration
	// MaxMessageBytes is the largest payload the relay sends; a larger row is dead at once.
	MaxMessageBytes int
	// InFlightBatches is the batches the relay keeps in flight at once, each holding a
	// connection of the pool until it is committed (1: the serial relay).
	InFlightBatches int
}

// The relays a service runs (<SERVICE>_RELAY_MODE): both publish the same outbox with the
// same guarantees; docs/runbook.md says how to move from one to the other.
const (
	RelayModePoll = "poll"
	RelayModeWAL  = "wal"
)

// ConsumerSettings are the inbox consumer's settings, the same variables in both services
// (<SERVICE>_CONSUMER_*, [ConsumerEnv] and ConsumerConcurrency in their Config, read with
// envconfig.Section).
// Zero values take pkg/inbox/inboxrabbitmq's defaults.
type ConsumerSettings struct {
	// Prefetch and Concurrency bound the messages in hand and in work.
	Prefetch    int
	Concurrency int
	// MaxDeliveries is the attempts a message gets before it is dead-lettered;
	// RetryBaseDelay the first wait between them, doubling per attempt.
	MaxDeliveries  int
	RetryBaseDelay time.Duration
	// RetryMaxDelay caps the retry backoff, also between the in-place retries of a message
	// held through a database outage; MaxHold is how long such a message is held before it
	// is handed back to the queue (without counting a delivery).
	RetryMaxDelay time.Duration
	MaxHold       time.Duration
	// BatchSize is the messages one inbox transaction takes, each under its own savepoint,
	// and BatchWait how long it waits for them (0: it takes what has arrived); AckEvery the
	// processed messages acknowledged together with one multiple ack (0: the library's
	// default, 8 or a quarter of Prefetch).
	BatchSize int
	BatchWait time.Duration
	AckEvery  int
}

// Apply returns c with the settings of s.
func (s ConsumerSettings) Apply(c inboxrabbitmq.Config) inboxrabbitmq.Config {
	c.Prefetch, c.Concurrency, c.MaxDeliveries = s.Prefetch, s.Concurrency, s.MaxDeliveries
	c.RetryBaseDelay, c.RetryMaxDelay, c.MaxHold = s.RetryBaseDelay, s.RetryMaxDelay, s.MaxHold
	c.BatchSize, c.BatchWait, c.AckEvery = s.BatchSize, s.BatchWait, s.AckEvery
	return c
}

// RedeliveryWindow is the longest time in which a duplicate of an event can still reach a
// consumer, exported as inbox_redelivery_window_seconds beside the inbox retention (an alert
// fires when the retention is not longer):
//
//	window = RetryWindow(<SERVICE>_CONSUMER_MAX_DELIVERIES, <SERVICE>_CONSUMER_RETRY_DELAY, consumer max retry delay)
//	       + RetryWindow(<SERVICE>_RELAY_MAX_ATTEMPTS, 1s, 5m)
//
// The first term is the consumer's own retries: MaxDeliveries attempts, backing off
// exponentially from RetryBaseDelay up to RetryMaxDelay (or RetryBaseDelay when larger).
// The second is the producing relay's: a row whose publish failed is tried again up to
// relayMaxAttempts times, backing off from [RelayRetryBaseDelay] to [RelayRetryMaxDelay],
// and a failed attempt may have reached the broker, so each retry may deliver a duplicate.
// The producer is the other service's relay, whose settings this process does not know: its
// own relay's (same defaults) stand for them. RetryWindow sums the waits without their
// jitter, which only shortens them.
func RedeliveryWindow(c ConsumerSettings, relayMaxAttempts int) time.Duration {
	consumer := inboxmetrics.RetryWindow(c.MaxDeliveries, c.RetryBaseDelay, max(c.RetryMaxDelay, c.RetryBaseDelay))
	producer := inboxmetrics.RetryWindow(relayMaxAttempts, RelayRetryBaseDelay, RelayRetryMaxDelay)
	return consumer + producer
}

// ConsumerConfig configures [AddConsumer].
type ConsumerConfig struct {
	// Consumer configures the inbox consumer: its URLs, Queue, Name, Handler, dead-letter
	// exchange and Setup. AddConsumer applies Settings to it and sets its Logger, Hooks,
	// TracerProvider and Propagator to p's.
	Consumer inboxrabbitmq.Config
	// Settings tune the consumer.
	Settings ConsumerSettings
	// KnownTypes are the message types the handler knows: the type label of the consumer's
	// metrics (inboxrabbitmqmetrics.Config.KnownTypes).
	KnownTypes []string
	// Retention and CleanupInterval configure the cleanup of processed inbox rows
	// (inbox.RunCleanup; 0 takes its defaults). Retention is exported beside the redelivery
	// window too.
	Retention, CleanupInterval time.Duration
	// RelayMaxAttempts is the producing relay's, for the redelivery window ([RedeliveryWindow]).
	RelayMaxAttempts int
	// BrokerDownGrace is how long the consumer may be cut off from the broker before its
	// readiness check fails.
	BrokerDownGrace time.Duration
}

// AddConsumer adds the inbox consumer ("consumer") on p's pool, wrapped by
// internal/aftercommit (so that a handler can count what it did once the inbox transaction
// committed), and the cleanup of processed inbox rows ("inbox cleanup") to p's group, with the
// consumer's metrics (inboxrabbitmqmetrics, and the redelivery window beside the retention)
// and p's crash points, and returns the consumer's readiness check for /readyz: the
// consumer's own Ready, which tolerates BrokerDownGrace without the broker (a broker restart
// should not take every consumer out of a load balancer at once; a consumer that cannot
// consume for minutes should). The consumer backs off and logs an outage once by itself
// (pkg/inbox/inboxrabbitmq); nothing here retries it. [AddRelay] is its twin. The consumer is
// returned for its Status (an app's Consuming); p runs it.
func AddConsumer(p *Process, cfg ConsumerConfig) (*inboxrabbitmq.Consumer, readiness.Check, error) {
	name := cfg.Consumer.Name
	metrics, err := inboxrabbitmqmetrics.NewConsumer(p.Registry, inboxrabbitmqmetrics.Config{KnownTypes: cfg.KnownTypes, ConstLabels: p.ConstLabels()})
	if err != nil {
		return nil, readiness.Check{}, fmt.Errorf("register consumer metrics: %w", err)
	}
	metrics.Init(name)
	window, err := inboxmetrics.NewWindow(p.Registry, p.ConstLabels())
	if err != nil {
		return nil, readiness.Check{}, fmt.Errorf("register inbox window metrics: %w", err)
	}
	window.Set(name, cfg.Retention, RedeliveryWindow(cfg.Settings, cfg.RelayMaxAttempts))
	ccfg := cfg.Settings.Apply(cfg.Consumer)
	ccfg.Logger, ccfg.TracerProvider, ccfg.Propagator = p.Log, p.TracerProvider, p.Propagator
	ccfg.Hooks = metrics.Hooks(inboxrabbitmq.Hooks{
		Failpoint: failpoint.Hook(p.Failpoints, func(h inboxrabbitmq.FailpointHit) string { return h.Name }),
	})
	consumer, err := inboxrabbitmq.NewConsumer(aftercommit.Wrap(p.Pool()), ccfg)
	if err != nil {
		return nil, readiness.Check{}, fmt.Errorf("inbox consumer: %w", err)
	}
	metrics.SetPoolSize(name, consumer.PoolSize())
	p.Group.Add("consumer", consumer.Run)
	p.Group.Add("inbox cleanup", func(ctx context.Context) error {
		return inbox.RunCleanup(ctx, p.Pool(), inbox.CleanupConfig{Retention: cfg.Retention, Interval: cfg.CleanupInterval, Logger: p.Log})
	})
	return consumer, readiness.Check{Name: "consumer", Check: readiness.Ready(consumer.Ready, cfg.BrokerDownGrace)}, nil
}

// RelayConfig configures [AddRelay].
type RelayConfig struct {
	// Publisher configures the broker connection; AddRelay sets its Logger and Hooks.
	Publisher outboxrabbitmq.Config
	// Settings tune the relay.
	Settings RelaySettings
	// Retention and CleanupInterval configure the cleanup of published rows
	// (outbox.RunCleanup; 0 takes its defaults).
	Retention, CleanupInterval time.Duration
	// BrokerDownGrace is how long the relay may be cut off from the broker (or the database)
	// before its readiness check fails.
	BrokerDownGrace time.Duration
}

// AddRelay adds the outbox relay ("outbox relay") on p's pool and the cleanup of published
// rows ("outbox cleanup") to p's group, with the relay's metrics and p's crash points, and
// returns the relay's readiness check for /readyz. An idle relay does not try the broker, so
// its check notices an outage with the next message it has to publish. The relay, the
// publisher and the cleanup get p's log; each backs off and logs an outage once by itself
// (pkg/outbox's outage backoff), and nothing here retries them.
func AddRelay(p *Process, cfg RelayConfig) (readiness.Check, error) {
	metrics, err := outboxmetrics.NewRelay(p.Registry, p.ConstLabels())
	if err != nil {
		return readiness.Check{}, fmt.Errorf("register relay metrics: %w", err)
	}
	publisherMetrics, err := outboxrabbitmqmetrics.NewPublisher(p.Registry, p.ConstLabels())
	if err != nil {
		return readiness.Check{}, fmt.Errorf("register publisher metrics: %w", err)
	}
	pcfg := cfg.Publisher
	pcfg.Logger, pcfg.Hooks = p.Log, publisherMetrics.Hooks(outboxrabbitmq.Hooks{})
	s := cfg.Settings
	// A connection per batch in flight: each batch is sent as soon as it is claimed.
	pcfg.Connections = cmp.Or(pcfg.Connections, s.InFlightBatches, outbox.DefaultInFlightBatches)
	pub, err := outboxrabbitmq.New(pcfg)
	if err != nil {
		return readiness.Check{}, fmt.Errorf("outbox publisher: %w", err)
	}
	ocfg := outbox.Config{
		BatchSize:       s.BatchSize,
		PollInterval:    s.PollInterval,
		MaxAttempts:     s.MaxAttempts,
		PublishTimeout:  s.PublishTimeout,
		ClaimTimeout:    s.ClaimTimeout,
		MaxMessageBytes: s.MaxMessageBytes,
		InFlightBatches: s.InFlightBatches,
		RetryBaseDelay:  RelayRetryBaseDelay,
		RetryMaxDelay:   RelayRetryMaxDelay,
		Logger:          p.Log,
		TracerProvider:  p.TracerProvider,
		Propagator:      p.Propagator,
		Hooks: metrics.Hooks(outbox.Hooks{
			Failpoint: failpoint.Hook(p.Failpoints, func(h outbox.FailpointHit) string { return h.Name }),
		}),
	}
	relay, err := newRelay(p, pub, ocfg, s.Mode)
	if err != nil {
		_ = pub.Close()
		return readiness.Check{}, fmt.Errorf("outbox relay: %w", err)
	}
	metrics.SetPoolSize(relay.PoolSize())
	p.Group.OnStop(func() { _ = pub.Close() }) // the relay is done with it
	p.Group.Add("outbox relay", relay.Run)
	p.Group.Add("outbox cleanup", func(ctx context.Context) error {
		return outbox.RunCleanup(ctx, p.Pool(), outbox.CleanupConfig{
			Retention: cfg.Retention, Interval: cfg.CleanupInterval, Logger: p.Log,
		})
	})
	return readiness.Check{Name: "relay", Check: readiness.Ready(relay.Ready, cfg.BrokerDownGrace)}, nil
}

// relay is what AddRelay needs of either relay.
type relay interface {
	Run(ctx context.Context) error
	Ready(maxUnavailable time.Duration) error
	PoolSize() outbox.PoolSize
}

// newRelay returns the relay of mode on p's pool. The WAL relay's replication connection
// goes to the pool's database, with the pool's own settings left out.
func newRelay(p *Process, pub outbox.Publisher, cfg outbox.Config, mode string) (relay, error) {
	switch mode {
	case "", RelayModePoll:
		return outbox.NewRelay(p.Pool(), pub, cfg)
	case RelayModeWAL:
		return outbox.NewWALRelay(p.Pool(), pub, cfg, outbox.WALConfig{URL: replicationURL(p.Pool().Config().ConnString()), Slot: WALSlot(p.name)})
	}
	return nil, fmt.Errorf("relay mode %q: want %q or %q", mode, RelayModePoll, RelayModeWAL)
}

// WALSlot is the replication slot of service's WAL relay: its outbox table's default
// (outbox.Tables.WALName) after the service's name. A slot's name is the server's, not a
// database's, and the services may share a server (compose runs one PostgreSQL for both).
func WALSlot(service string) string { return service + "_" + outbox.Tables{}.WALName() }

// replicationURL is the database URL dbURL without pgxpool's settings (pool_max_conns, …),
// which a lone connection would send to the server as its own. A keyword/value string
// (host=… dbname=…) is returned as it is.
func replicationURL(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return dbURL
	}
	// The other parameters as they are: re-encoding them would write a space as "+", which
	// libpq's parser, and pgx's, read as a plus.
	var kept []string
	for _, kv := range strings.Split(u.RawQuery, "&") {
		if kv != "" && !strings.HasPrefix(kv, "pool_") {
			kept = append(kept, kv)
		}
	}
	u.RawQuery = strings.Join(kept, "&")
	return u.String()
}

// AddJob adds the periodic job to p's group under job.Name, run by [Every] (which backs off
// after a failed run and logs a failure streak once), with p's log unless job has a Logger.
func AddJob(p *Process, job Job) {
	job.Logger = cmp.Or(job.Logger, p.Log)
	p.Group.Add(job.Name, func(ctx context.Context) error { return Every(ctx, job) })
}

// AddOutboxStats adds the outbox backlog metrics of p's database ("outbox stats") to its
// group. The API process reads them, not the relay, so that the backlog stays visible while
// the relay is down. The stats loop gets p's log, and backs off and logs an outage once by
// itself (pkg/outbox/outboxmetrics).
func AddOutboxStats(p *Process) error {
	stats, err := outboxmetrics.NewStats(p.Registry, p.Pool(), outboxmetrics.StatsConfig{ConstLabels: p.ConstLabels(), Logger: p.Log, Slot: WALSlot(p.name)})
	if err != nil {
		return fmt.Errorf("register outbox stats metrics: %w", err)
	}
	p.Group.Add("outbox stats", stats.Run)
	return nil
}

// Listen binds addr ("127.0.0.1:0" in tests) and registers its closing with p's group, for
// a start-up that fails before the server runs.
func Listen(ctx context.Context, p *Process, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	p.Group.OnStop(func() { _ = ln.Close() }) // already closed by the server when it ran
	return ln, nil
}

// AddServer adds an HTTP server of h on ln (internal/httpserver: timeouts, graceful shutdown
// within shutdownTimeout) to p's group under name.
func AddServer(p *Process, name string, ln net.Listener, h http.Handler, shutdownTimeout time.Duration) {
	p.Group.Add(name, func(ctx context.Context) error {
		return httpserver.Serve(ctx, ln, h, httpserver.Config{ShutdownTimeout: shutdownTimeout}, p.Log)
	})
}

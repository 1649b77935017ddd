package amqp

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// ConsumerName is the warehouse's inbox consumer name. Keep it stable: renaming it forgets
// which messages were processed.
const ConsumerName = "warehouse"

// ConsumerConfig configures [NewConsumer]. Zero values take pkg/inbox/rabbitmq's defaults.
type ConsumerConfig struct {
	// URL of the broker. Required.
	URL      string
	Topology Topology
	// Declarer declares Topology on every connect. Default: one of its own; a process that
	// runs the relay too shares one, so that it warns once about a queue that exists with
	// other arguments.
	Declarer *amqptopo.Declarer
	// ConsumerSettings tune the consumer (internal/service: the same settings in both
	// services).
	service.ConsumerSettings
	// ShutdownTimeout bounds the wait for messages in work when stopping.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
	Hooks           rabbitmq.Hooks
	// Committed is the handler's [Handler].Committed: called with every decision that changed
	// something, after its transaction committed. Optional.
	Committed func(warehouse.Decision)
	// TracerProvider makes the consumer's process spans; Propagator reads the trace context
	// of a delivery and records the handler's in its answers (docs/tracing.md). nil: the
	// global ones.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// NewConsumer returns the inbox consumer of the warehouse queue: it declares cfg.Topology
// on every connect (amqptopo), applies each message with a [Handler] in the inbox transaction on pool,
// and dead-letters to the topology's dead-letter exchange with the queue name as routing
// key. Its transactions run the handler's Committed after they committed (aftercommit).
func NewConsumer(pool inbox.TxBeginner, cfg ConsumerConfig) (*rabbitmq.Consumer, error) {
	if cfg.Declarer == nil {
		d, err := amqptopo.NewDeclarer(cfg.URL, cfg.Topology.Shared(), cfg.Logger)
		if err != nil {
			return nil, err
		}
		cfg.Declarer = d
	}
	h := NewHandler(cfg.Topology.Exchange, cfg.Logger)
	h.Committed = cfg.Committed
	h.outbox = h.outbox.WithPropagator(cfg.Propagator)
	c, err := rabbitmq.NewConsumer(aftercommit.Wrap(pool), cfg.ConsumerSettings.Apply(rabbitmq.Config{
		URL:                  cfg.URL,
		Queue:                cfg.Topology.Queue,
		Name:                 ConsumerName,
		Handler:              h.Handle,
		DeadLetterExchange:   cfg.Topology.DeadLetterExchange,
		DeadLetterRoutingKey: cfg.Topology.Queue,
		Setup:                cfg.Declarer.Setup,
		ShutdownTimeout:      cfg.ShutdownTimeout,
		Logger:               cfg.Logger,
		Hooks:                cfg.Hooks,
		TracerProvider:       cfg.TracerProvider,
		Propagator:           cfg.Propagator,
	}))
	if err != nil {
		return nil, fmt.Errorf("new consumer: %w", err)
	}
	return c, nil
}

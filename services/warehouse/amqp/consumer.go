package amqp

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// ConsumerName is the warehouse's inbox consumer name. Keep it stable: renaming it forgets
// which messages were processed.
const ConsumerName = "warehouse"

// ConsumerConfig configures [NewConsumer]. Zero values take pkg/inbox/inboxrabbitmq's defaults.
type ConsumerConfig struct {
	// URLs of the broker, or of the nodes of a cluster (pkg/inbox/inboxrabbitmq's Config.URLs).
	// Required.
	URLs     []string
	Topology Topology
	// Store applies the events ([NewHandler]). Required.
	Store OrderApplier
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
	Hooks           inboxrabbitmq.Hooks
	// TracerProvider makes the consumer's process spans, and Propagator reads the trace
	// context of a delivery (docs/tracing.md); the Store records it in the answers with a
	// propagator of its own (postgres.StoreConfig). nil: the global ones.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// NewConsumer returns the inbox consumer of the warehouse queue: it declares cfg.Topology
// on every connect (amqptopo), applies each message with [NewHandler] on cfg.Store in the
// inbox transaction on pool, and dead-letters to the topology's dead-letter exchange with the
// queue name as routing key. Its transactions run the callbacks registered on them with
// aftercommit.Register once they committed (the app counts the decisions so).
func NewConsumer(pool inbox.TxBeginner, cfg ConsumerConfig) (*inboxrabbitmq.Consumer, error) {
	if cfg.Store == nil {
		return nil, errors.New("new consumer: Store is required")
	}
	if cfg.Declarer == nil {
		d, err := amqptopo.NewDeclarer(cfg.URLs, cfg.Topology.Shared(), cfg.Logger)
		if err != nil {
			return nil, err
		}
		cfg.Declarer = d
	}
	c, err := inboxrabbitmq.NewConsumer(aftercommit.Wrap(pool), cfg.ConsumerSettings.Apply(inboxrabbitmq.Config{
		URLs:                 cfg.URLs,
		Queue:                cfg.Topology.Queue,
		Name:                 ConsumerName,
		Handler:              NewHandler(cfg.Store, cfg.Logger),
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

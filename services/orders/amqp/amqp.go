// Package amqp is the orders service's RabbitMQ adapter: the topology it declares at start-up
// (docs/events.md, "Topology") and the handler of the warehouse's stock events, run by the
// pkg/inbox/inboxrabbitmq consumer.
package amqp

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/services/orders"
)

// ConsumerName is the orders service's inbox consumer name. Keep it stable: the inbox
// deduplicates per name, so renaming it forgets which messages were processed.
const ConsumerName = "orders"

// Topology is what the orders service declares on the broker, after docs/events.md:
// amqptopo.Names, the shape both services give their topology. The queue of stock events
// (quorum) is bound to [StockRoutingKeys] and dead-letters to DeadLetterExchange with its own
// name; the dead-letter queue (quorum, without a delivery limit) is bound there with Queue as
// routing key; DeliveryLimit, the queue's x-delivery-limit, is the broker's own bound on
// redeliveries of a message that kills its consumer (the consumer counts its retries itself).
type Topology amqptopo.Names

// DefaultTopology returns the names of docs/events.md: the shop's exchanges, the queue
// orders.stock and its dead letters in orders.stock.dead (amqptopo.DefaultNames).
func DefaultTopology() Topology { return Topology(amqptopo.DefaultNames("orders.stock")) }

// WithDefaults returns t with its zero fields set to those of [DefaultTopology].
func (t Topology) WithDefaults() Topology {
	return Topology(amqptopo.Names(t).WithDefaults(amqptopo.Names(DefaultTopology())))
}

// StockRoutingKeys are the routing keys the orders queue is bound to.
var StockRoutingKeys = []string{orders.RoutingKeyStockReserved, orders.RoutingKeyStockRejected, orders.RoutingKeyStockReleased}

// Validate reports a missing name or a bad delivery limit of t as it is, without defaults.
func (t Topology) Validate() error { return amqptopo.Names(t).Topology().Validate() }

// Shared returns t, its zero fields defaulted, as internal/amqptopo declares it: the queue
// bound to StockRoutingKeys. The service declares it with an amqptopo.Declarer, which keeps
// a queue that exists with other arguments (a changed delivery limit) instead of failing.
func (t Topology) Shared() amqptopo.Topology {
	return amqptopo.Names(t.WithDefaults()).Topology(StockRoutingKeys...)
}

// Declare declares the topology on ch and fails on the first refusal (amqptopo.Topology's
// Declare): for tests and tools that own the broker.
func (t Topology) Declare(ch *amqp.Channel) error { return t.Shared().Declare(ch) }

// StockApplier applies a stock event to its order inside the inbox transaction: the store as
// the handler sees it (the app wraps *postgres.Store to count the outcomes).
type StockApplier interface {
	ApplyStockUpdate(ctx context.Context, tx pgx.Tx, u orders.StockUpdate) (orders.StockOutcome, error)
}

// NewHandler returns the inbox handler of the stock events: it decodes a delivery
// (orders.DecodeStockEvent) and applies it through store. StockReserved, StockRejected and
// StockReleased move their order per the saga; an illegal transition or an unknown order is
// logged and acknowledged; an unknown event type, an unsupported version or a body that is not
// such an event is dead-lettered (inbox.Permanent) with the reason. Any other error (the
// database, a deadlock) is returned as it is: the transaction rolls back and the consumer
// retries the message.
func NewHandler(store StockApplier, log *slog.Logger) inboxrabbitmq.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
		ev, err := orders.DecodeStockEvent(d.Type, d.Body)
		if err != nil {
			log.WarnContext(ctx, "stock event dead-lettered", "message_id", d.ID, "event", d.Type, "error", err)
			return inbox.Permanent(err)
		}
		u := orders.StockUpdate{Event: ev.Event, OrderID: ev.OrderID, Reason: ev.Reason, MessageID: d.ID}
		attrs := []any{"order_id", u.OrderID, "message_id", d.ID, "event", u.Event, "correlation_id", d.CorrelationID}
		out, err := store.ApplyStockUpdate(ctx, tx, u)
		switch {
		case err != nil:
			return fmt.Errorf("apply %s to order %s: %w", u.Event, u.OrderID, err)
		case !out.Found:
			log.WarnContext(ctx, "stock event for an unknown order: acknowledged, nothing changed", attrs...)
		case !out.Applied:
			log.WarnContext(ctx, "illegal transition: acknowledged, nothing changed", append(attrs, "from", out.From)...)
		default:
			log.InfoContext(ctx, "order status changed", append(attrs, "from", out.From, "to", out.To)...)
		}
		return nil
	}
}

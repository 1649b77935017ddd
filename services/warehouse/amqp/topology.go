// Package amqp is the warehouse's RabbitMQ adapter: the topology it declares at start-up
// ([Topology]) and the handler of the orders service's events ([NewHandler]), run by the
// pkg/inbox/inboxrabbitmq consumer. The consumer, the outbox relay and its publisher are
// wired by internal/service (AddConsumer, AddRelay), the same in both services.
//
// Messages come in through pkg/inbox/inboxrabbitmq. The handler maps a delivery to the domain: it
// decodes the event (package warehouse) and applies it through [OrderApplier], the store as
// the handler sees it, in one transaction together with the message's inbox row; the store
// writes the answer (StockReserved, StockRejected, StockReleased) to the warehouse's outbox
// in that same transaction, so an answer exists if and only if the effect does. The relay
// publishes the answers later.
package amqp

import (
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// Topology names what the warehouse declares, after docs/events.md: amqptopo.Names, the
// shape both services give their topology. The queue (quorum) is bound to order.created and
// order.cancelled and dead-letters to DeadLetterExchange with its own name; the dead-letter
// queue (quorum, without a delivery limit) is bound there with Queue as routing key;
// DeliveryLimit, the queue's x-delivery-limit, is the broker's own bound on redeliveries of
// a message that kills its consumer.
type Topology amqptopo.Names

// DefaultTopology returns the names of docs/events.md: the shop's exchanges, the queue
// warehouse.orders and its dead letters in warehouse.orders.dead (amqptopo.DefaultNames).
func DefaultTopology() Topology { return Topology(amqptopo.DefaultNames("warehouse.orders")) }

// WithDefaults returns t with its zero fields set to those of [DefaultTopology].
func (t Topology) WithDefaults() Topology {
	return Topology(amqptopo.Names(t).WithDefaults(amqptopo.Names(DefaultTopology())))
}

// Validate reports a missing name or a bad delivery limit of t as it is, without defaults.
func (t Topology) Validate() error { return amqptopo.Names(t).Topology().Validate() }

// Shared returns t, its zero fields defaulted, as internal/amqptopo declares it: the queue
// bound to order.created and order.cancelled. The service declares it with an
// amqptopo.Declarer, which keeps a queue that exists with other arguments (a changed
// delivery limit) instead of failing.
func (t Topology) Shared() amqptopo.Topology {
	return amqptopo.Names(t.WithDefaults()).Topology(warehouse.RoutingKeyOrderCreated, warehouse.RoutingKeyOrderCancelled)
}

// Declare declares the exchanges, the queues and their bindings on ch, and fails on the
// first refusal (amqptopo.Topology's Declare): for tests and tools that own the broker.
func (t Topology) Declare(ch *amqp091.Channel) error { return t.Shared().Declare(ch) }

// Package amqp is the warehouse's RabbitMQ adapter: the topology it declares at start-up
// ([Topology]), the handler of the orders service's events ([Handler]), and the constructor
// of the inbox consumer that uses them. The outbox relay and its publisher are wired by
// internal/service (AddRelay), the same in both services.
//
// Messages come in through pkg/inbox/rabbitmq: each is applied in one transaction together
// with its inbox row, and its answer (StockReserved, StockRejected, StockReleased) is
// written to the warehouse's outbox in that same transaction, so an answer exists if and
// only if the effect does. The relay publishes the answers later.
package amqp

import (
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// Topology names what the warehouse declares, after docs/events.md.
type Topology struct {
	// Exchange is the events exchange (topic, durable). Default "shop.events".
	Exchange string
	// DeadLetterExchange is the dead-letter exchange (direct, durable). Default "shop.dlx".
	DeadLetterExchange string
	// Queue is the warehouse's queue (quorum), bound to order.created and order.cancelled.
	// Default "warehouse.orders".
	Queue string
	// DeadLetterQueue (quorum, without a delivery limit) is bound to DeadLetterExchange with
	// Queue as routing key. Default "warehouse.orders.dead".
	DeadLetterQueue string
	// DeliveryLimit is the quorum queues' x-delivery-limit: a safety net for a consumer that
	// crashes in a loop on one message. The broker then dead-letters the message to
	// DeadLetterExchange with Queue as routing key. Default 20.
	DeliveryLimit int
}

// DefaultTopology returns the names of docs/events.md.
func DefaultTopology() Topology {
	return Topology{
		Exchange:           "shop.events",
		DeadLetterExchange: "shop.dlx",
		Queue:              "warehouse.orders",
		DeadLetterQueue:    "warehouse.orders.dead",
		DeliveryLimit:      20,
	}
}

// Validate reports a missing name or a bad delivery limit.
func (t Topology) Validate() error { return t.Shared().Validate() }

// Shared returns t as internal/amqptopo declares it: the queue bound to order.created and
// order.cancelled, dead-lettering to the dead-letter exchange with its own name, and a
// dead-letter queue without a delivery limit, which keeps what it holds however often it is
// peeked. The service declares it with an amqptopo.Declarer, which keeps a queue that
// exists with other arguments (a changed delivery limit) instead of failing.
func (t Topology) Shared() amqptopo.Topology {
	return amqptopo.Topology{
		Exchange: t.Exchange, DeadLetterExchange: t.DeadLetterExchange,
		Queue: t.Queue, RoutingKeys: []string{warehouse.RoutingKeyOrderCreated, warehouse.RoutingKeyOrderCancelled},
		DeadLetterQueue: t.DeadLetterQueue, DeliveryLimit: t.DeliveryLimit,
	}
}

// Declare declares the exchanges, the queues and their bindings on ch, and fails on the
// first refusal (amqptopo.Topology's Declare): for tests and tools that own the broker.
func (t Topology) Declare(ch *amqp091.Channel) error { return t.Shared().Declare(ch) }

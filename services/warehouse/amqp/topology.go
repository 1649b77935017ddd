// Package amqp is the warehouse's RabbitMQ adapter: the topology it declares at start-up
// ([Topology]), the handler of the orders service's events ([Handler]), and constructors for
// the inbox consumer and the outbox publisher that use them.
//
// Messages come in through pkg/inbox/rabbitmq: each is applied in one transaction together
// with its inbox row, and its answer (StockReserved, StockRejected, StockReleased) is
// written to the warehouse's outbox in that same transaction, so an answer exists if and
// only if the effect does. The relay publishes the answers later.
package amqp

import (
	"fmt"

	amqp091 "github.com/rabbitmq/amqp091-go"

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
	// DeadLetterQueue (quorum) is bound to DeadLetterExchange with Queue as routing key.
	// Default "warehouse.orders.dead".
	DeadLetterQueue string
	// DeliveryLimit is the quorum queues' x-delivery-limit: a safety net for a consumer that
	// crashes in a loop on one message. The broker then dead-letters the message to
	// DeadLetterExchange with Queue as routing key. Default 20.
	DeliveryLimit int
}

// Queue arguments RabbitMQ 3.10 understands that amqp091-go has no constant for.
const (
	deliveryLimitArg        = "x-delivery-limit"
	deadLetterExchangeArg   = "x-dead-letter-exchange"
	deadLetterRoutingKeyArg = "x-dead-letter-routing-key"
)

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
func (t Topology) Validate() error {
	switch {
	case t.Exchange == "", t.DeadLetterExchange == "", t.Queue == "", t.DeadLetterQueue == "":
		return fmt.Errorf("topology: every name is required: %+v", t)
	case t.DeliveryLimit < 1:
		return fmt.Errorf("topology: delivery limit must be positive, is %d", t.DeliveryLimit)
	}
	return nil
}

// Declare declares the exchanges, the queues and their bindings. Every declaration is
// idempotent, so it runs on every (re)connect of the consumer and the publisher (their
// Setup); a broker that lost them is repaired.
func (t Topology) Declare(ch *amqp091.Channel) error {
	if err := ch.ExchangeDeclare(t.Exchange, amqp091.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp091.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.DeadLetterExchange, err)
	}
	// A message that reaches the delivery limit is dead-lettered by the broker to the same
	// place the consumer dead-letters to, rather than dropped.
	queueArgs := amqp091.Table{
		amqp091.QueueTypeArg:    amqp091.QueueTypeQuorum,
		deliveryLimitArg:        int64(t.DeliveryLimit),
		deadLetterExchangeArg:   t.DeadLetterExchange,
		deadLetterRoutingKeyArg: t.Queue,
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, queueArgs); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.Queue, err)
	}
	deadArgs := amqp091.Table{
		amqp091.QueueTypeArg: amqp091.QueueTypeQuorum,
		deliveryLimitArg:     int64(t.DeliveryLimit),
	}
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, deadArgs); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.DeadLetterQueue, err)
	}
	for _, key := range []string{warehouse.RoutingKeyOrderCreated, warehouse.RoutingKeyOrderCancelled} {
		if err := ch.QueueBind(t.Queue, key, t.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s with %s: %w", t.Queue, t.Exchange, key, err)
		}
	}
	if err := ch.QueueBind(t.DeadLetterQueue, t.Queue, t.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s with %s: %w", t.DeadLetterQueue, t.DeadLetterExchange, t.Queue, err)
	}
	return nil
}

// Package events is the contract between the payments service, which publishes
// PaymentCaptured through its outbox, and the ledger, which consumes it through its inbox:
// the event's type and payload, and the RabbitMQ topology both sides declare. It is the one
// place that names them, so that the producer's routing key is the binding of the
// consumer's queue and the consumer accepts the type the producer writes.
package events

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PaymentCaptured is the event's type (the AMQP type property, what the ledger's consumer
// accepts) and its routing key on [Topology.Exchange] (what the ledger's queue is bound to).
const PaymentCaptured = "payment.captured"

// ContentType is the content type the outbox relay publishes with, and the only one the
// ledger accepts.
const ContentType = "application/json"

// Payment is the payload of a PaymentCaptured event.
type Payment struct {
	ID          string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

// Topology names the exchange the payments service publishes to and the queues the ledger
// consumes from. Both services take the same value: [DefaultTopology] in production, unique
// names in tests.
type Topology struct {
	// Exchange is a durable topic exchange, declared by both sides.
	Exchange string
	// Queue is the ledger's queue, a durable quorum queue bound to Exchange with
	// PaymentCaptured.
	Queue string
	// DeadLetterQueue holds what the ledger cannot process, with the reason in a header. The
	// ledger's consumer publishes there through the default exchange.
	DeadLetterQueue string
}

// DefaultTopology returns the names the two commands use.
func DefaultTopology() Topology {
	return Topology{
		Exchange:        "billing.events",
		Queue:           "ledger.payments",
		DeadLetterQueue: "ledger.payments.dead",
	}
}

// DeclareExchange declares the exchange: the producer's Setup, run by its publisher on every
// (re)connect. Without it, a relay started before any consumer has its publishes refused
// (NOT_FOUND), which costs its rows attempts.
func (t Topology) DeclareExchange(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
	}
	return nil
}

// DeclareQueues declares the exchange, the dead-letter queue and the ledger's queue with its
// binding: the consumer's Setup, run on every (re)connect. Until the queue is bound, the
// broker returns what the relay publishes as unroutable (the relay publishes with the
// mandatory flag) and the relay retries it with backoff, counting attempts until it marks
// the row dead: start the ledger first, or declare the queues at deployment.
func (t Topology) DeclareQueues(ch *amqp.Channel) error {
	if err := t.DeclareExchange(ch); err != nil {
		return err
	}
	// The dead-letter side first. On RabbitMQ 4, where quorum queues have a delivery limit
	// of 20 by default, give the dead-letter queue x-delivery-limit -1 by policy, so that
	// looking at its messages (a get with requeue) never drops one.
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false,
		amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.DeadLetterQueue, err)
	}
	// The broker's own bound on redeliveries (a consumer crashing in a loop on one message)
	// dead-letters where the consumer does, through the default exchange, instead of
	// dropping the message.
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": t.DeadLetterQueue,
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.Queue, err)
	}
	if err := ch.QueueBind(t.Queue, PaymentCaptured, t.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", t.Queue, t.Exchange, err)
	}
	return nil
}

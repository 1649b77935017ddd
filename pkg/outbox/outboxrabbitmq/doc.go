// Package outboxrabbitmq publishes outbox messages to RabbitMQ with publisher confirms.
//
// [Publisher] implements outbox.Publisher, and outbox.ConcurrentPublisher with more than one
// [Config].Connections. The relay hands each batch to [Publisher.Publish], which sends it on
// one confirm-mode channel with every message in flight at once, reads each message's fate
// from its own confirm, and blames every failure on exactly one thing, the message, the broker,
// or neither; the deadline of its context bounds every step, even a socket write to a broker
// that stopped reading. Publish lists the outcomes; the folder's README.md has them as a table
// (README.md#what-the-rabbitmq-publisher-reports).
//
// The publisher connects lazily and again after the connection closed: each Publish call first
// makes sure it has an open channel (an explicit supervisor; amqp091-go's own recovery is not
// used, so every reconnect is visible here and in [Hooks]). A channel the broker closed over
// one message is replaced by a new channel on the same connection: a message's fault never
// costs a reconnect. [Config].URLs lists the nodes of a cluster (README.md#several-brokers says
// what a cluster of quorum queues buys).
package outboxrabbitmq

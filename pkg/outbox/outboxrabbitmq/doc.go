// Package outboxrabbitmq publishes outbox messages to RabbitMQ with publisher confirms.
//
// [Publisher] implements outbox.Publisher, and outbox.ConcurrentPublisher with more than one
// [Config].Connections; [Publisher.Publish] says what it reports, which the folder's
// README.md has as a table (README.md#what-the-rabbitmq-publisher-reports). It connects on
// first use and again after a connection closed, to the nodes of [Config].URLs in turn
// (README.md#several-brokers); a message's fault never costs a reconnect.
package outboxrabbitmq

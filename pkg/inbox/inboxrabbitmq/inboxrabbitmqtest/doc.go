// Package inboxrabbitmqtest runs an adopter's [inboxrabbitmq.Handler] on a delivery inside a
// real PostgreSQL transaction, without a broker, and reports what the RabbitMQ consumer built
// from the same [inboxrabbitmq.Config] would do next: [Deliver] once, or [RequireHandledOnce]
// twice. The consumer's own checks of the delivery run first, the same code as the
// consumer's; a handler that panics is a failed attempt, as in the consumer.
//
// It builds on inboxtest, which stays broker-neutral (no amqp091-go), and sits beside the
// adapter it drives, as inboxrabbitmqmetrics does. It imports only the inbox packages, pgx and
// the standard library, so it is copied with the inbox folder.
package inboxrabbitmqtest

// Package inboxrabbitmqtest runs an adopter's [inboxrabbitmq.Handler] on a delivery inside a real
// PostgreSQL transaction, without a broker, and reports what the RabbitMQ consumer built from
// the same [inboxrabbitmq.Config] would do next.
//
// # Outcomes
//
// [Deliver] records the delivery in the inbox of cfg.Tables as consumer cfg.Name, through
// inboxtest.Deliver, and reports the [Outcome] the consumer would reach: acknowledged,
// acknowledged as a duplicate, held and retried in place (a transient error), retried as a
// counted attempt, or dead-lettered with its reason (a permanent error, the last of
// [inboxrabbitmq.Config].MaxDeliveries attempts, a message id or type the inbox cannot store, or
// what the consumer refuses before any handler runs). A handler that panics is treated as the
// consumer treats it: as a failed attempt. The consumer's own checks of the delivery (body
// size, content type, type, and JSON syntax, which a body without a content type must pass)
// run first, the same code as the consumer's. [RequireHandledOnce] delivers twice and
// asserts the second was a duplicate that did not call the handler.
//
// inboxtest.Options.BeforeCommit looks into the handler's transaction before it commits.
//
// # Why a package of its own
//
// The broker-neutral inboxtest does not import the RabbitMQ adapter (nor amqp091-go): a
// service whose consumer reads another broker uses it alone. This package sits beside the
// adapter it drives, as rabbitmqmetrics does. It imports only the inbox packages, pgx and the
// standard library, so it is copied with the inbox folder.
package inboxrabbitmqtest

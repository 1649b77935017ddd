// Package inboxtest runs an adopter's inbox handler on a message inside a real PostgreSQL
// transaction, without a broker, and reports what the consumer would make of the outcome.
//
// # The plain inbox
//
// [Deliver] runs a handler through [inbox.Process] exactly as a consumer does: it records the
// message in the inbox, calls the handler with the transaction and commits, or finds the
// message there already and reports a duplicate without calling the handler. Its [Result]
// tells whether the handler ran, whether the delivery was a duplicate, the error and its
// [inbox.Class]: what a runner does next (retry without counting, dead-letter at once, or
// count an attempt). [RequireProcessedOnce] delivers a message twice and asserts that the
// first delivery was processed and the second was a duplicate that did not call the handler.
//
// # The RabbitMQ consumer
//
// [DeliverRabbitMQ] does the same for a [rabbitmq.Handler], given the [rabbitmq.Config] the
// service builds its consumer from, and reports the [Outcome] the consumer would reach:
// acknowledged, acknowledged as a duplicate, held and retried in place (a transient error),
// retried as a counted attempt, or dead-lettered with its reason (a permanent error, the last
// of [rabbitmq.Config].MaxDeliveries attempts, a message id or type the inbox cannot store, or
// what the consumer refuses before any handler runs). A handler that panics is treated as the
// consumer treats it: as a failed attempt. The consumer's checks of the delivery (body size,
// content type, type, and JSON syntax, which a body without a content type must pass) run
// first, through [rabbitmq.Config.Refusal], as the consumer runs them.
//
// # Looking into the transaction
//
// [Options].BeforeCommit is called with the transaction after the handler returned nil and
// before the commit, so a test can assert on what the handler wrote in it (with the outbox's
// outboxtest.RequireAdded, say, for the events it added).
//
// The assertions take a [TB], the part of testing.TB they use. The package imports only the
// inbox packages, pgx and the standard library, so it can be copied with the inbox folder.
package inboxtest

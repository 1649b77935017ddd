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
// # Your own table
//
// [Options].Tables names the inbox to record messages in, as the consumer's [inbox.Store] does:
// a table of your own naming, in a schema of your own. The zero value is the default
// inbox_messages.
//
// # The RabbitMQ consumer
//
// The package is broker-neutral: it imports neither the RabbitMQ adapter nor its client. To
// run a inboxrabbitmq.Handler and see the outcome the RabbitMQ consumer would reach (acknowledged,
// held, retried, dead-lettered and why), use the rabbitmqtest package beside the adapter
// (pkg/inbox/inboxrabbitmq/inboxrabbitmqtest), which builds on this one.
//
// # Looking into the transaction
//
// [Options].BeforeCommit is called with the transaction after the handler returned nil and
// before the commit, so a test can assert on what the handler wrote in it (with the outbox's
// outboxtest.RequireAdded, say, for the events it added).
//
// The assertions take a [TB], the part of testing.TB they use. The package imports only the
// inbox package, pgx and the standard library, so it can be copied with the inbox folder.
package inboxtest

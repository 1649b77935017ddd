// Package inboxtest runs an adopter's inbox handler on a message inside a real PostgreSQL
// transaction, without a broker, and reports what the consumer would make of the outcome:
// [Deliver] once, or [RequireProcessedOnce] twice, through [inbox.Process] exactly as a
// consumer does, in the inbox of [Options].Tables. [Options].BeforeCommit looks into the
// transaction before it commits (to assert with the outbox's outboxtest.RequireAdded, say).
//
// The package is broker-neutral: it imports only the inbox package, pgx and the standard
// library, so it can be copied with the inbox folder. For what the RabbitMQ consumer would
// do (acknowledge, hold, retry, dead-letter and why), use inboxrabbitmq/inboxrabbitmqtest,
// which builds on this one.
package inboxtest

// Package inbox makes the effects of received messages happen once, although brokers deliver
// them at least once: the consumer half of the transactional outbox and inbox pair, for
// PostgreSQL through pgx v5. [Process] records each message id in the same transaction as the
// handler's writes, so that a redelivery is skipped.
//
// # Overview
//
//   - The schema: [Migrate] at start-up, or [Migrations] for goose and golang-migrate.
//   - Each message: [Process], in one transaction with the handler's writes.
//   - Failures: [Classify] tells a runner whether to retry a failed attempt, and whether it
//     counts; a handler marks its own errors with [Transient] or [Permanent].
//   - Retention: [RunCleanup] (or [Cleanup] from a scheduler) deletes what is older than
//     [CleanupConfig].Retention, so that the table does not grow for ever.
//   - Your own table names and schema: a [Store] of your [Tables].
//   - Millions of messages a day: [Tables].Partition keeps the table partitioned by
//     processing time, and Cleanup drops old partitions whole (README.md#partitioned-tables).
//   - Synchronous standbys: [CommitReplicated].
//
// Subpackages: inboxrabbitmq runs this loop for a RabbitMQ queue, with retries, dead letters,
// reconnects and holding messages through outages; inboxtest and
// inboxrabbitmq/inboxrabbitmqtest run a handler in your tests; inboxmetrics and
// inboxrabbitmq/inboxrabbitmqmetrics export Prometheus metrics.
//
// README.md in this folder says how to use them, and what the inbox guarantees and does not
// (Guarantees, Ordering), with several consumers per database, and in operation.
package inbox

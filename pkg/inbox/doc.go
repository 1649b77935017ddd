// Package inbox makes the effects of received messages happen once, although brokers deliver
// them at least once. It is the consumer half of the transactional outbox and inbox pair, for
// PostgreSQL through pgx v5.
//
// A consumer that applies a message and then acknowledges it cannot do both atomically: if it
// dies in between, the broker delivers the message again and the change is applied twice.
// [Process] records the message id in the inbox table and runs the handler in the same
// transaction, so that a redelivery finds the row and is skipped; acknowledge the delivery
// only when Process returned nil (from the example of [Process]):
//
//	msg := inbox.Message{ID: "order-42", Type: "order.placed"}
//	for range 2 { // the broker delivers the message twice
//		duplicate, err := inbox.Process(ctx, pool, "stock", msg, reserve)
//		if err != nil {
//			panic(err) // do not acknowledge: the broker redelivers it
//		}
//		fmt.Println("duplicate:", duplicate) // acknowledge the delivery in both cases
//	}
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
//   - Synchronous standbys: [CommitReplicated].
//
// Subpackages: rabbitmq runs this loop for a RabbitMQ queue, with retries, dead letters,
// reconnects and holding messages through outages; inboxtest and inboxrabbitmq/inboxrabbitmqtest run
// a handler in your tests; metrics and inboxrabbitmq/inboxrabbitmqmetrics export Prometheus metrics.
//
// README.md in this folder says how to use them, and what the inbox guarantees and does not
// (Guarantees, Ordering), with several consumers per database, and in operation.
package inbox

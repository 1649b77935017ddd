// Package inboxrabbitmq consumes a RabbitMQ queue into PostgreSQL through the inbox, so that each
// message's effects happen once although RabbitMQ delivers at least once: a [Consumer], made
// by [NewConsumer] from a [Config], runs until its context ends.
//
// # The path of a message
//
// For every [Delivery] the consumer does one of five things: it processes it with
// inbox.Process under [Config].Name and acknowledges it (also as a duplicate); retries a
// counted failure as a copy at the tail of the queue; holds a transient failure in place,
// uncounted; hands a held delivery back, uncounted; or dead-letters what no retry can fix
// ([Reasons]). [Handler] says which error leads where; the Outcome constants name the paths.
//
// Every copy is confirmed by the broker before the original is acknowledged: no path
// acknowledges a message before its outcome is durable, in PostgreSQL or in a confirmed
// publish, and no path drops one. A crash between the two leaves both copies in the queue;
// the inbox takes the second as a duplicate.
//
// With [Config].BatchSize above 1 the consumer processes up to that many deliveries in one
// transaction (inbox.Store.ProcessBatch, which runs the batch again with a savepoint per
// message once one has failed), and what fails for one message goes its way alone. Processed deliveries are acknowledged together, with
// the multiple flag, never past a delivery still in hand ([Config].AckEvery).
//
// The inbox folder's README.md says the rest (Batches and acknowledgements among it): what the broker counts (The path of a message),
// how to declare the queues (Topology), several brokers, operations, and the limits.
//
// # Replaying dead letters
//
// Once their cause is fixed, [ReplayDeadLetters] moves the dead letters a [ReplayConfig]
// selects back to the queue each came from, as replays with a fresh set of attempts; a dry
// run only counts them. A dead letter leaves its queue only after the broker confirmed its
// copy.
//
// # Status, metrics and tracing
//
// [Consumer.Ready], [Consumer.Status] and [Consumer.PoolSize] serve readiness checks and
// status pages; [Hooks] feed metrics (package inboxrabbitmqmetrics) and chaos tests; each
// delivery has a process span ([TracerName]). Package inboxrabbitmqtest runs a Handler as the
// consumer would, without a broker.
package inboxrabbitmq

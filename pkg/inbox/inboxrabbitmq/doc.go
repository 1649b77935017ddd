// Package inboxrabbitmq consumes a RabbitMQ queue into PostgreSQL through the inbox, so that each
// message's effects happen once although RabbitMQ delivers at least once.
//
// Create a [Consumer] with [NewConsumer] from a [Config], and run it with [Consumer.Run]
// until the context ends.
//
// # The path of a message
//
// For every [Delivery] the consumer does one of five things, and only one:
//
//   - Dead-letter a message that no retry can fix: refused before any transaction (the
//     checks run in the order of [Reasons]), marked inbox.Permanent by its [Handler], or
//     failed on the last of [Config].MaxDeliveries attempts. [HeaderDeadReason] says why.
//   - Process it: inbox.Process records the message id under [Config].Name and runs the
//     Handler in the same transaction; the delivery is acknowledged after the commit, or
//     at once as a duplicate.
//   - Retry it after a failure that counts: a copy goes to the tail of the queue after a
//     backoff ([Config].RetryBaseDelay), its [HeaderRetries] increased.
//   - Hold it after a transient failure (inbox.Classify): unacknowledged, tried again in
//     place, uncounted by the consumer and the broker alike.
//   - Hand it back after [Config].MaxHold, or when the consumer stops: a copy goes to the
//     tail of the queue, uncounted ([Hooks].HandedBack).
//
// Every copy is confirmed by the broker before the original is acknowledged: no path
// acknowledges a message before its outcome is durable, in PostgreSQL or in a confirmed
// publish, and no path drops one. A crash between the two leaves both copies in the queue;
// the inbox takes the second as a duplicate.
//
// The inbox folder's README.md says the rest: every reason and what the broker counts (The
// path of a message), how to declare the queues (Topology), several brokers, stopping, the
// logs of an outage, and the limits.
//
// # Status, metrics and tracing
//
// [Consumer.Ready] and [Consumer.Status] tell a readiness check whether the consumer can do
// its job, [Consumer.PoolSize] whether its pool is large enough. [Hooks] report each outcome,
// for metrics (package rabbitmqmetrics) and chaos tests. Each delivery is handled under an
// OpenTelemetry process span ([Config].TracerProvider), a child of the trace context in its
// headers, with the Attr constants, an [EventHeld] per transient failure and the outcome;
// the handler's ctx carries it. Package rabbitmqtest runs a Handler as the consumer would,
// without a broker.
package inboxrabbitmq

// Package rabbitmq consumes a RabbitMQ queue into PostgreSQL through the inbox, so that each
// message's effects happen once although RabbitMQ delivers at least once.
//
// Create a [Consumer] with [NewConsumer] and run it with [Consumer.Run] until the context
// ends. It connects, declares the topology through [Config].Setup, consumes with manual
// acknowledgements and a prefetch limit, handles up to [Config].Concurrency messages at a
// time, and reconnects with backoff when the broker goes away.
//
// # The path of a message
//
// For every delivery the consumer does one of four things, and only one.
//
// Process and acknowledge. A message with a message-id (and, when its content type is JSON or
// empty, a body that is valid JSON) goes to inbox.Process: one transaction records the
// message id under [Config].Name, runs the [Handler] with that transaction, and commits. Only
// after the commit does the consumer acknowledge the message. If the message id was already
// recorded, the handler is skipped and the message is acknowledged as a duplicate. A crash
// between commit and acknowledgement therefore costs a redelivery, which the inbox absorbs;
// a crash before the commit rolls everything back, and the redelivery processes the message
// again.
//
// Retry. When the handler returns an error, the transaction rolls back. The consumer waits a
// backoff (RetryDelay doubled per attempt, capped at MaxRetryDelay, jittered), publishes a
// copy of the message to the same queue through the default exchange, with the same message
// id, body and properties and the header x-outboxshop-retries increased, waits for the
// broker's confirm, and only then acknowledges the original. The copy goes to the tail of
// the queue. The handler sees the attempt number in [Delivery].DeliveryCount.
//
// Dead-letter. A message without a message-id, with a malformed JSON body, whose handler
// returned an error wrapped with inbox.Permanent, or that failed [Config].MaxDeliveries
// times, is published to [Config].DeadLetterExchange with [Config].DeadLetterRoutingKey,
// with the same message id, body and properties plus the headers x-outboxshop-dead-reason,
// x-outboxshop-original-queue and x-outboxshop-original-routing-key. The consumer
// acknowledges the original only after the broker confirmed the dead letter and did not
// return it as unroutable. A dead letter replayed into the queue starts with a fresh count.
//
// Hand back. When republishing or dead-lettering fails, or the database fails outside the
// handler (it cannot begin or commit), the message is rejected with requeue after a backoff
// and counts no attempt: an outage neither loses messages nor dead-letters healthy ones.
// When the consumer stops, messages it has not started are handed back at once.
//
// No path acknowledges a message before its outcome is durable, in PostgreSQL or in a
// confirmed publish, and no path drops one.
//
// # Duplicates the consumer itself may cause
//
// If the process dies after a retry copy was confirmed and before the original was
// acknowledged, both copies are in the queue with the same message id; whichever is processed
// second is a duplicate for the inbox. Likewise a dead letter may be published twice, when
// the acknowledgement after it was lost.
//
// # Stopping
//
// When Run's context ends, the consumer cancels its subscription, hands prefetched messages
// back, lets the handlers that are running finish and acknowledges them, for at most
// [Config].ShutdownTimeout; then it cancels their context (they roll back and are
// redelivered later), closes the connection and returns nil, leaving no goroutine behind.
//
// # Observability
//
// Logs go to [Config].Logger (log/slog) with the attributes consumer, queue, message_id and
// message_type. Reconnect attempts are logged once per change between connected and
// disconnected. [Hooks] report processed messages, duplicates, errors, retries, dead letters
// and the connection state, for metrics, and [Hooks].Failpoint lets chaos tests kill the
// process at [FailpointBeforeCommit] and [FailpointAfterCommit].
//
// # Limits
//
// A message that kills the process (a crash in native code, an out-of-memory kill) is never
// counted by the consumer, which counts only its own retries; declare the queue as a quorum
// queue with a delivery-limit to bound such loops. While a message waits for its retry
// backoff it holds one of the Concurrency workers and one prefetch slot.
package rabbitmq

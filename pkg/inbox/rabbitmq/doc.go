// Package rabbitmq consumes a RabbitMQ queue into PostgreSQL through the inbox, so that each
// message's effects happen once although RabbitMQ delivers at least once.
//
// Create a [Consumer] with [NewConsumer] and run it with [Consumer.Run] until the context
// ends. It connects, declares the topology through [Config].Setup, consumes with manual
// acknowledgements and a prefetch limit, handles up to [Config].Concurrency messages at a
// time, and reconnects with backoff when the broker goes away. [Consumer.Ready] and
// [Consumer.Status] tell a readiness check whether it can do its job. Each message handled
// at the same time holds a connection of the pool; [Consumer.PoolSize] tells whether the
// pool has one for each (NewConsumer logs a warning when it has not).
//
// # The path of a message
//
// For every delivery the consumer does one of five things, and only one.
//
// Dead-letter at once. A message that no retry can fix is published to
// [Config].DeadLetterExchange with [Config].DeadLetterRoutingKey, with the same message id,
// body and properties plus the headers x-outboxshop-dead-reason (one of the Reason
// constants, a colon and the details), x-outboxshop-original-queue and
// x-outboxshop-original-routing-key. These are checked before any transaction, in this
// order, so a bad message costs no database work:
//
//   - [ReasonMissingMessageID]: no message-id property; the inbox cannot deduplicate it.
//   - [ReasonInvalidMessageID], [ReasonInvalidMessageType]: the message-id or type is not
//     valid UTF-8, contains a NUL byte, or is longer than 255 bytes (inbox.MaxMessageIDBytes,
//     inbox.MaxMessageTypeBytes): PostgreSQL could not store it in the inbox.
//   - [ReasonBodyTooLarge]: the body is longer than [Config].MaxBodyBytes (default 1 MiB).
//   - [ReasonUnsupportedContentType]: the content type is not in [Config].ContentTypes, when
//     that is set, or it is a JSON type whose charset is not UTF-8.
//   - [ReasonUnknownType]: the type is not in [Config].Types, when that is set.
//   - [ReasonMalformedJSON]: a JSON content type (or none) and a body that is not valid JSON,
//     or not valid UTF-8.
//
// The consumer acknowledges the original only after the broker confirmed the dead letter and
// did not return it as unroutable. A dead letter replayed into the queue starts with a fresh
// count.
//
// Process and acknowledge. Any other message goes to inbox.Process: one transaction records
// the message id under [Config].Name, runs the [Handler] with that transaction, and commits.
// Only after the commit does the consumer acknowledge the message. If the message id was
// already recorded, the handler is skipped and the message is acknowledged as a duplicate. A
// crash between commit and acknowledgement therefore costs a redelivery, which the inbox
// absorbs; a crash before the commit rolls everything back, and the redelivery processes
// the message again.
//
// When the transaction fails, inbox.Classify decides what follows, for the handler's errors
// and the database's alike:
//
//   - Permanent (an error wrapped with inbox.Permanent; an id or type this database cannot
//     store): dead-letter at once, [ReasonPermanent].
//   - Transient (the database unreachable, restarting or out of connections, a connection
//     lost, a deadlock or serialization failure, a lock timeout, statement_timeout, an
//     error wrapped with inbox.Transient): hold, below. Costs no attempt.
//   - Anything else (a constraint violation, a data exception, the handler's own error):
//     retry, and after [Config].MaxDeliveries attempts dead-letter, [ReasonMaxDeliveries].
//
// Retry. The consumer waits a backoff (RetryDelay doubled per attempt, capped at
// MaxRetryDelay, jittered), publishes a copy of the message to the same queue through the
// default exchange, with the same message id, body and properties and the header
// x-outboxshop-retries increased, waits for the broker's confirm, and only then acknowledges
// the original. The copy goes to the tail of the queue. The handler sees the attempt number
// in [Delivery].DeliveryCount.
//
// Hold. After a transient failure the consumer keeps the delivery unacknowledged and tries
// the same stage again in place (the transaction, or a publish of a retry copy or dead letter
// that failed), after a backoff from RetryDelay up to MaxRetryDelay (at most a quarter of
// MaxHold). An unacknowledged delivery costs the broker nothing: RabbitMQ counts a delivery
// (a quorum queue's x-delivery-count, which x-delivery-limit bounds) only when a message is
// rejected with requeue or its channel closes. So an outage of the database, however long,
// uses up neither the consumer's attempts nor the broker's delivery limit: when the database
// is back, each held message is processed, once.
//
// Hand back. A delivery is held for at most [Config].MaxHold (default 15 minutes) from its
// arrival, because RabbitMQ closes the channel of a consumer that keeps a delivery
// unacknowledged longer than its consumer_timeout (30 minutes by default since 3.8.17), which
// would requeue, and count, every delivery on it. Then the consumer republishes a copy to
// the tail of the queue through the default exchange (same id, body, properties and retry
// count; the broker's x-delivery-count removed), waits for the confirm, and acknowledges the
// original: the copy is a new message with a delivery count of zero, and its own hold starts
// when it arrives. When the consumer stops, a held delivery is handed back the same way at
// once, after the subscription ended, so that a restart during an outage costs nothing
// either. [Hooks].HandedBack reports both ([HandBackHoldLimit], [HandBackShutdown]).
//
// What the broker does count ([HandBackRequeued]): a hand-back that cannot be published (the
// connection is gone, the shutdown timeout passed) becomes a reject with requeue, or is left
// to the broker when the channel is closed; so does a message whose handler
// [Config].ShutdownTimeout cut short, and a prefetched message not yet started when the
// consumer stops. Republishing those would move them behind the queue on every restart, for
// a cost of one delivery per stop or lost connection, not per minute of an outage. Keep
// x-delivery-limit well above the number of restarts and broker disconnections a message may
// live through (RabbitMQ 4's default of 20 is fine); and keep Concurrency equal to Prefetch
// (the default), so that during an outage every prefetched message is held, not waiting.
//
// No path acknowledges a message before its outcome is durable, in PostgreSQL or in a
// confirmed publish, and no path drops one.
//
// # Duplicates the consumer itself may cause
//
// If the process dies after a retry copy or a hand-back copy was confirmed and before the
// original was acknowledged, both copies are in the queue with the same message id;
// whichever is processed second is a duplicate for the inbox. Likewise a dead letter may be
// published twice, when the acknowledgement after it was lost.
//
// # Topology
//
// The consumer declares nothing itself; [Config].Setup does. Declare queues so that they
// cannot lose a message and so that changing them does not stop the consumer:
//
//   - The consumed queue: a quorum queue, with x-dead-letter-exchange (and routing key)
//     pointing at the dead-letter queue, so that what the broker gives up on (the delivery
//     limit, a TTL) lands there instead of being dropped. x-delivery-limit bounds a message
//     that crashes the process in a loop; since outages no longer count, 20 is ample.
//   - The dead-letter queue: no delivery limit and no dead-letter exchange of its own. A
//     limit would let anyone who peeks with requeue (the management UI's "get messages")
//     delete dead letters after that many peeks. On RabbitMQ 3.x leave x-delivery-limit
//     unset (no limit is the default there; -1 is not "unlimited" on 3.x: it dead-letters,
//     or drops, a message at its first requeue).
//     RabbitMQ 4 gives every quorum queue a limit of 20 unless it is set to -1; set -1
//     there, by policy, or make the dead-letter queue a classic queue.
//   - Queue arguments are fixed when a queue is created: redeclaring a queue with another
//     x-delivery-limit fails with PRECONDITION_FAILED. Put such settings in a policy
//     (rabbitmqctl set_policy … '{"delivery-limit": 20}' --apply-to quorum_queues), which
//     can change at any time, or recreate the queue. If Setup still declares other
//     arguments than the queue has, the consumer logs a warning, reports it in
//     [Status].SetupWarning, and consumes the existing queue as it is instead of stopping;
//     declarations after the failed one are skipped, so declare exchanges and the
//     dead-letter queue before the consumed queue.
//   - On a cluster, a quorum queue has a replica on every node by default, up to the
//     cluster's size when it is declared; x-quorum-initial-group-size sets fewer (3 or 5:
//     an odd number, so that a majority survives the loss of a minority). A message is
//     confirmed, and a consumer's ack counts, once a majority of the replicas has it.
//
// # Several brokers
//
// [Config].URLs lists the nodes of a cluster. They are tried round-robin from a random
// start: the first connection goes to a random node, so that consumers given the same list
// spread over the cluster; after a failed attempt or a lost connection, the next attempt
// takes the next URL in the list, so that a dead node costs one refused dial and every
// other node is tried before it again. One attempt tries each URL at most once; between
// attempts that reach no broker the consumer waits as [Config].ReconnectDelay says. The
// outbox's RabbitMQ publisher connects the same way.
//
// When the node the consumer is connected to dies, the messages it had in hand go back to
// their queue (their acknowledgements are lost with the connection; a handler that
// committed already makes its redelivery a duplicate for the inbox), and the consumer
// carries on through the next node. A quorum queue whose leader died is led by another
// replica within a second or so; its consumers on other nodes keep their subscription.
//
// # Stopping
//
// When Run's context ends, the consumer cancels its subscription, hands prefetched messages
// back, hands held messages back uncounted, lets the handlers that are running finish and
// acknowledges them, for at most [Config].ShutdownTimeout; then it cancels their context
// (they roll back and are redelivered later), closes the connection and returns nil, leaving
// no goroutine behind.
//
// # Readiness and observability
//
// [Consumer.Ready] returns an error once the consumer has been disconnected from the broker
// for longer than a bound the caller chooses; a readiness endpoint answers 503 with it.
// [Consumer.Status] has the details, including how many deliveries are held. The database
// is not part of it: a consumer whose database is down holds its messages and loses none.
//
// Logs go to [Config].Logger (log/slog) with the attributes consumer, queue, message_id and
// message_type. An outage is logged once, not per attempt, by each of two failure streaks:
// "rabbitmq consumer: broker connection" (the connection lost, or attempts that fail) and
// "rabbitmq consumer: held deliveries" (deliveries held after transient failures, the
// database down, say). Each writes a warning when it starts, with the error; at most one
// more every 30 seconds while it lasts, with how many attempts failed; and one line when it
// ends (consuming again; a delivery settled and none held), with how long it lasted. A
// delivery's own hold (its start, its retries in place, a hand-back at MaxHold, its end) is
// logged at debug level, as is each failed connection attempt. [Hooks] report processed
// messages, duplicates, errors, retries, dead letters, holds, hand-backs and the connection
// state, for metrics (see package rabbitmqmetrics), and [Hooks].Failpoint lets chaos tests
// kill the process at [FailpointBeforeCommit] and [FailpointAfterCommit].
//
// # Tracing
//
// Each delivery is handled under an OpenTelemetry process span made with
// [Config].TracerProvider: kind consumer, a child of the trace context that
// [Config].Propagator reads from the delivery's headers (an outbox relay's publish span puts
// its own there; a delivery without one starts a trace), with the messaging semantic
// conventions' attributes, [AttrConsumer], [AttrDeliveryCount], an [EventHeld] event per
// transient failure, and [AttrOutcome]: processed, duplicate, retried, dead_lettered or
// handed_back. The handler's ctx carries the span, so its own spans (and the trace context
// an outbox.Add in it records) nest under it; a duplicate's span has inbox.duplicate set by
// inbox.Process and no children. Both fields default to the global provider and
// propagator; without an SDK installed nothing is recorded.
//
// # Limits
//
// A message that kills the process (a crash in native code, an out-of-memory kill) is never
// counted by the consumer, which counts only its own retries; the quorum queue's
// delivery-limit bounds such loops. A message whose handler fails transiently for ever (it
// returns inbox.Transient for a condition that never ends) is held and handed back for ever,
// never dead-lettered: watch the held and handed-back metrics. While a message waits for a
// retry backoff or is held, it occupies one of the Concurrency workers and one prefetch
// slot.
//
// # Testing a handler
//
// The rabbitmqtest subpackage runs a [Handler] on a [Delivery] as the consumer built from the
// same [Config] would, in a real transaction and without a broker, and reports the outcome
// (acknowledged, duplicate, held, retried, dead-lettered and why).
package rabbitmq

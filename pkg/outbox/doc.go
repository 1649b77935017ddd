// Package outbox is a transactional outbox for PostgreSQL (pgx v5).
//
// A service that changes its database and must tell the world about it cannot do both
// atomically: the broker is not part of the transaction. The outbox makes the message part of
// it. [Add] writes the event into the outbox_messages table inside the caller's transaction,
// so the business change and its events commit, or roll back, together. A [Relay] then
// publishes committed rows to the broker through a [Publisher] (the rabbitmq subpackage has
// the RabbitMQ one) and marks them published.
//
// # Setup
//
// Apply the schema with [Migrate] at start-up, or copy migrations/*.sql into your own
// migration tool. Write with [Add] in your transaction. Run a [Relay] in any process that can
// reach the database and the broker: in the service itself or on its own.
//
// # Guarantees
//
//   - Nothing is lost: a row stays pending until the broker confirmed it. The relay marks a row
//     published only after its publisher confirm, in the same transaction that claimed it.
//   - At-least-once delivery, not exactly-once: if a relay dies after the broker confirmed a
//     batch and before its transaction committed, the rows are pending again and are published
//     a second time, with the same message id. Consumers deduplicate on that id (the inbox
//     package does it in the consumer's own transaction), which makes effects happen once.
//   - A broker outage costs no attempts: connection-level failures ([ErrUnavailable]) pause the
//     relay (its circuit breaker, visible as [StateBrokerUnavailable]) and it probes with
//     backoff; only failures of a message itself (nack, unroutable return, encode error)
//     count against [Config].MaxAttempts.
//   - A poison message does not stall the outbox: after MaxAttempts, or at once for a
//     permanent error or a payload over [Config].MaxMessageBytes, the row is marked dead and
//     the rows behind it go on. [ListDead] and [Requeue] let an operator replay it later.
//
// # Several relays
//
// Relays claim batches with SELECT … FOR UPDATE SKIP LOCKED inside a transaction that lasts
// until the batch is published and marked. Any number of relays may run against one table:
// no row is published by two relays at once, and none waits for another relay's batch.
// A relay that dies releases its rows with its transaction.
//
// # Ordering
//
// Rows of one aggregate (AggregateType, AggregateID) are published in the order they were
// written (their seq), also with several relays: only the oldest pending row of each aggregate
// can be claimed, so the next one is claimed only once the previous one was confirmed and its
// mark committed. The limits:
//
//   - Order is write order. Two transactions that write rows for the same aggregate
//     concurrently commit in an order the outbox cannot know; serialise writers of one
//     aggregate (lock its row, as any read-modify-write of it must anyway).
//   - A row that was written earlier but committed later than rows of other aggregates is
//     never skipped: claims keep no cursor, they take whatever is pending and due.
//   - A dead row does not block its aggregate: the rows written after it are published, and a
//     consumer sees a gap. A requeued dead row is then published after them. Consumers that
//     need strict order must detect such gaps (a version number in the event).
//   - A duplicate published after a relay crash can arrive after later events of the same
//     aggregate; the inbox drops it as a duplicate.
//   - Rows of different aggregates have no order between them.
//   - Throughput per aggregate is one row per relay cycle; throughput across aggregates is a
//     whole batch per cycle.
//
// # Wake-ups
//
// A trigger runs pg_notify on [NotifyChannel] when a writing transaction commits; relays
// LISTEN on a dedicated connection and start a cycle at once, so the latency from commit to
// broker is a cycle, not a poll interval. [Config].PollInterval remains as the fallback and as
// the clock for retries.
//
// Only one transaction at a time notifies. PostgreSQL serialises the commits of notifying
// transactions cluster-wide, each holding a lock through its WAL flush; if every outbox write
// notified, outbox writers could not commit faster than one disk flush at a time. So the
// trigger notifies only if no other transaction of the database is notifying at that moment;
// the writers that skip commit together with it, and the relay looks again
// [Config].NotifyRecheck after every notified cycle to publish their rows too: again at once
// while re-checks find rows, then less and less often until the poll interval takes over. A
// row of a writer whose commit outlasts the re-checks waits for the next notification or poll.
//
// # Operating
//
// [ReadStats] reads the backlog, the age of its oldest row and the dead count cheaply from the
// partial indexes; call it from a process other than the relay, so that a stalled relay is
// seen. [Cleanup] and [RunCleanup] delete old published rows in bounded batches.
// [Hooks] expose every cycle (for metrics) and the named crash points
// ([FailpointBeforePublish], [FailpointAfterPublish], [FailpointAfterMark]) used by chaos
// tests.
package outbox

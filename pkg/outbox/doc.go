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
// Apply the schema with [Migrate] at start-up, or apply migrations/*.sql, in order and each
// once, with your own migration tool. Write with [Add] in your transaction. Run a [Relay] in
// any process that can reach the database and the broker: in the service itself or on its
// own.
//
// Migrate records the versions it applied in the outbox_migrations table. When the schema is
// current it takes no lock on the outbox table, so every replica of a rolling deploy may call
// it at start-up while relays and writers run at full load. A migration that must change the
// table waits at most two seconds for its lock (lock_timeout) and then tries again, so writers
// never queue behind a waiting migration for long; while it holds the lock they wait for its
// work (version 2 rewrites the table: milliseconds for a table that Cleanup keeps small). The
// files are also safe to apply again, for a schema first applied by another tool.
//
// # Guarantees
//
// Every failure is blamed on exactly one thing — the message, the broker, or the database —
// and only a message's own fault costs it an attempt.
//
//   - Nothing is lost: a row stays pending until the broker confirmed it. The relay marks a row
//     published only after its publisher confirm, in the same transaction that claimed it.
//   - At-least-once delivery, not exactly-once: if a relay dies after the broker confirmed a
//     batch and before its transaction committed, the rows are pending again and are published
//     a second time, with the same message id. Consumers deduplicate on that id (the inbox
//     package does it in the consumer's own transaction), which makes effects happen once.
//   - A broker outage costs no attempts: connection-level failures ([ErrUnavailable]) pause the
//     relay (its circuit breaker, visible as [StateBrokerUnavailable]) and it probes with
//     backoff. A refusal for the broker's own reasons ([ErrRefused]: a full queue whose
//     consumers are down, a queue without quorum) costs no attempt either: the row is retried
//     after a backoff, and the relay stays running. Only failures of a message itself (an
//     unroutable return, a missing exchange, content the broker rejects) count against
//     [Config].MaxAttempts.
//   - A poison message does not stall the outbox. [Add] refuses, with [ErrInvalidMessage],
//     what the broker or PostgreSQL would refuse and the caller controls (see [Message]); a
//     row that is bad all the same (written by other code or by hand) is marked dead in the
//     cycle that first tries it, as is a payload over [Config].MaxMessageBytes; any other
//     failing row is dead after MaxAttempts. The rows behind it go on, and
//     [ListDead] and [Requeue] let an operator replay it later. A row the publisher leaves
//     unsent ([ErrNotSent]) five cycles in a row is charged an attempt, so that not even a
//     publisher that always skips one message can hold its aggregate for ever; and a cycle
//     that sends nothing is followed by a backoff, never by a busy loop.
//   - Every step is bounded in time. A batch's publish, every blocking step of it included,
//     ends within [Config].PublishTimeout; the claim transaction is bounded in PostgreSQL
//     itself by [Config].ClaimTimeout. A relay that is paused (SIGSTOP), hung or cut off
//     mid-batch therefore holds its rows, their aggregates and the vacuum horizon for at most
//     ClaimTimeout (default PublishTimeout + 5s = 35s); then the other relays publish them,
//     a second time if the broker had them already.
//   - The payload is published byte for byte as [Add] received it: the column is json, which
//     checks the text and keeps it (key order, white space, duplicate keys, the \u0000
//     escape), not jsonb, which would re-encode it.
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
//     whole batch per cycle. After a cycle that found rows the relay looks again at once
//     (see Wake-ups), so an aggregate's backlog drains at one row per cycle, not per poll.
//   - One aggregate's backlog does not slow the others: rows that wait behind an older row
//     of their aggregate are taken out of the claim's index (the relay's maintenance marks
//     them, a few thousand per pass, and the row that takes the lead is released when its
//     predecessor is published or dies), so a claim costs about its batch whatever one
//     aggregate's backlog. make bench's item 6b measures it.
//
// # Wake-ups
//
// A trigger runs pg_notify on the table's channel ([Tables.NotifyChannel]; [NotifyChannel]
// for the default tables) when a writing transaction commits; relays
// LISTEN on a dedicated connection and start a cycle at once, so the latency from commit to
// broker is a cycle, not a poll interval. [Config].PollInterval remains as the fallback and as
// the clock for retries. After any cycle that found rows, or that a notification started, the
// relay looks again [Config].NotifyRecheck later.
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
// The trigger is deferred to COMMIT. A writer that runs SET CONSTRAINTS ALL IMMEDIATE after
// [Add] fires it early and holds the notifier's lock until its transaction ends; while it does,
// other writers do not notify, and their rows are found by re-checks and polls instead. That
// costs latency, never a row: leave the outbox trigger deferred (SET CONSTRAINTS names the
// constraints it means).
//
// # Operating
//
// [ReadStats] reads the backlog, the age of its oldest row and the dead count from the
// partial indexes, in time proportional to the backlog (a few milliseconds for 50,000 rows);
// call it every few seconds from a process other than the relay, so that a stalled relay is
// seen. [Cleanup] and [RunCleanup] delete old published rows in bounded batches.
// [Hooks] expose every cycle (for metrics) and the named crash points
// ([FailpointBeforePublish], [FailpointAfterPublish], [FailpointAfterMark]) used by chaos
// tests.
//
// # Your own table names and schema
//
// The package-level functions work on the default [Tables]: outbox_messages, with its
// versions in outbox_migrations, found through the connection's search_path. To keep several
// outboxes in one database (one per service or module), or an outbox in a schema of its own
// (a schema per tenant, one that search_path does not name), make a [Store] of your Tables
// with [NewStore] and call its methods, and give the relay the same Tables in
// [Config].Tables (from ExampleStore):
//
//	payments, err := outbox.NewStore(outbox.Tables{Schema: "billing", Messages: "payments_outbox"})
//	if err != nil {
//		log.Fatal(err) // wraps outbox.ErrInvalidTables
//	}
//	if err := payments.Migrate(ctx, pool); err != nil { // once, at start-up
//		log.Fatal(err)
//	}
//
// Everything else follows the table's names: its indexes and trigger, the trigger's function
// in the table's schema, the notify channel ([Tables.NotifyChannel]) and the advisory lock
// keys of migrations and notifications. Names are quoted in every statement, so upper case,
// spaces and quotes are kept as written; [Tables.Validate] says what is refused
// ([ErrInvalidTables]). Outboxes of different tables are independent: a relay claims only
// its table's rows and wakes only for its table's commits, ordering is per table, and a dead
// row concerns its table alone. The default tables keep the names and lock keys of earlier
// versions, so existing databases need no change.
//
// A Store renders its statements once, when it is made: make one per set of tables at
// start-up and share it. The package-level functions are the methods of the default Tables'
// store, and cost what they cost before.
package outbox

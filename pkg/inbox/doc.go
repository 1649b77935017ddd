// Package inbox makes the effects of received messages happen once, although brokers deliver
// them at least once. It is the consumer half of the transactional outbox and inbox pair, for
// PostgreSQL through pgx v5.
//
// A consumer that applies a message and then acknowledges it cannot do both atomically: if it
// dies in between, the broker delivers the message again and the change is applied twice. The
// inbox makes "this message was processed" part of the consumer's own transaction. [Process]
// inserts the message id into the inbox_messages table and runs the handler in the same
// transaction; a redelivery finds the row and is skipped. The broker is acknowledged only
// after the commit.
//
// The rabbitmq subpackage runs this loop for a RabbitMQ queue, with retries, dead-lettering,
// reconnects, and holding messages through outages; [Process] itself works with any broker.
//
// # Setup
//
// Apply the schema with [Migrate] at start-up, or copy migrations/001_inbox.sql (also
// available as [Migrations]) into your own migration tool. Then, for every delivery, run its
// handler through [Process] and acknowledge the delivery only when that returned nil (from
// the example of [Process], where the broker delivers one message twice):
//
//	reserve := func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, "sku-1")
//		return err
//	}
//	msg := inbox.Message{ID: "order-42", Type: "order.placed"}
//	for range 2 { // the broker delivers the message twice
//		duplicate, err := inbox.Process(ctx, pool, "stock", msg, reserve)
//		if err != nil {
//			panic(err) // do not acknowledge: the broker redelivers it
//		}
//		fmt.Println("duplicate:", duplicate) // acknowledge the delivery in both cases
//	}
//
// Run [RunCleanup] somewhere (or [Cleanup] from a scheduler) so the table does not grow for
// ever.
//
// # Guarantees
//
//   - At-least-once delivery is the broker's job: a message that was not acknowledged is
//     delivered again, after a crash, a lost connection or a restart. The inbox relies on
//     that; it does not make delivery reliable by itself.
//   - Effectively-once effects: the handler's writes commit together with the inbox row, or
//     not at all. A redelivery of a committed message is reported as a duplicate and its
//     handler is not run, so its database effects happen exactly once. Effects outside the
//     transaction (HTTP calls, e-mails, publishing) are not covered: a handler may run again
//     after a rollback or a crash, so such effects must be idempotent themselves, or go
//     through a transactional outbox written in the same transaction.
//   - Concurrent deliveries of the same message (a redelivery racing the original, two
//     replicas) serialise on the inbox row: the second waits for the first and then sees a
//     duplicate, or processes the message if the first rolled back. See [Process].
//   - Identity is the producer's message id, not the payload: two different messages must
//     never share an id, and a re-sent message must keep its id.
//   - A failed handler rolls back everything, the inbox row included, so the message can be
//     retried. Mark errors that no retry can fix with [Permanent]; runners dead-letter those
//     at once ([IsPermanent]).
//   - What the inbox stores is checked before the transaction ([Message.Validate]): a
//     message id or type that is not valid UTF-8, contains a NUL byte or is longer than 255
//     bytes is refused with a [Permanent] error, instead of failing the INSERT on every
//     redelivery.
//
// # Errors
//
// [Classify] sorts the error of a failed attempt into three classes, and the rabbitmq
// runner acts on them:
//
//   - [ClassTransient]: the infrastructure failed (the database unreachable, restarting, out
//     of connections, a connection lost mid-transaction, a statement timeout) or the
//     transaction lost a race (serialization failure, deadlock, lock not available), or the
//     error was marked with [Transient]. Retrying the same message later succeeds; a runner
//     retries it without counting an attempt, so an outage of any length costs no message.
//   - [ClassPermanent]: marked with [Permanent]. Dead-lettered at once.
//   - [ClassFailed]: anything else, including constraint violations (SQLSTATE 23), data
//     exceptions (22) and syntax or privilege errors (42). The attempt counts; a runner
//     retries a bounded number of times, because some of these do resolve (a concurrent
//     insert commits, a row that a foreign key needs arrives), then dead-letters.
//
// [Process] classifies its own failures the same way: a failed begin is transient, a failed
// insert of the inbox row is permanent when PostgreSQL refused the value and transient
// otherwise, a failed commit is classified as it is. A handler marks its own errors with
// [Transient] (the service it calls is down) or [Permanent] (the payload breaks the
// contract). See [Classify] for every rule.
//
// # Ordering
//
// The inbox gives no ordering guarantee, and neither does a queue once anything goes wrong:
//
//   - Messages are applied in delivery order only with one consumer, one worker and no
//     failures. With several workers or replicas, messages are applied concurrently.
//   - A redelivered message (after a crash or an outage) arrives after messages that were
//     published later. A retried message is republished to the tail of its queue, behind
//     everything that arrived meanwhile.
//   - A duplicate can arrive long after later messages; the inbox drops it, so a duplicate
//     never undoes a later change.
//
// Handlers that need order must carry it in the data: a version or sequence number per
// aggregate, compared inside the transaction (apply only the next version, or only a newer
// one).
//
// # Retention
//
// Inbox rows are kept for [CleanupConfig].Retention and then deleted by [Cleanup]. The
// retention must exceed the longest time in which a duplicate can still arrive: broker
// redeliveries, retries, an outbox relay republishing after a crash, a replay of dead letters
// or of an old queue. A duplicate that arrives after its row was deleted is not recognised
// and is applied a second time. Days or weeks are cheap; minutes are a bug.
//
// # Several consumers per database
//
// The inbox key is (consumer, message id). Each handler that consumes the same message into
// one database (billing and shipping both reacting to order.placed, say) uses its own consumer
// name and processes the message once. Keep the names stable: renaming a consumer forgets
// what it processed. Several replicas of the same handler share one name.
//
// # Your own table names and schema
//
// The package-level functions work on the default [Tables]: inbox_messages, with its
// versions in inbox_migrations, found through the connection's search_path. To keep several
// inboxes in one database (one per service or module), or an inbox in a schema of its own (a
// schema per tenant, one that search_path does not name), make a [Store] of your Tables with
// [NewStore] and call its methods, and give the RabbitMQ consumer the same Tables in its
// Config.Tables (from ExampleStore):
//
//	ledger, err := inbox.NewStore(inbox.Tables{Schema: "billing", Messages: "ledger_inbox"})
//	if err != nil {
//		panic(err) // wraps inbox.ErrInvalidTables
//	}
//	if err := ledger.Migrate(ctx, pool); err != nil { // once, at start-up
//		panic(err)
//	}
//
// A message is deduplicated per table (and, within it, per consumer name): inboxes of
// different tables know nothing of each other's messages, and [Store.Cleanup] cleans its own
// table. The index and the advisory lock key of migrations are derived from the names. Names
// are quoted in every statement, so upper case, spaces and quotes are kept as written;
// [Tables.Validate] says what is refused ([ErrInvalidTables]). The default tables keep the
// names and lock key of earlier versions, so existing databases need no change.
//
// A Store renders its statements once, when it is made: make one per set of tables at
// start-up and share it. The package-level functions are the methods of the default Tables'
// store.
package inbox

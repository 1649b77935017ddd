// Package outbox is a transactional outbox for PostgreSQL (pgx v5).
//
// [Add] writes events into the outbox table inside the caller's transaction ([AddSQL]
// through database/sql, [QueueAdd] on the caller's pgx.Batch), so that the business change
// and its events commit, or roll back, together. A [Relay] then publishes the committed rows
// through a [Publisher] (package outboxrabbitmq has the RabbitMQ one) and marks them
// published. The package-level functions work on the default [Tables]; a [Store] has each of
// them as a method, for tables of your naming.
//
// This documentation is the reference; the folder's README.md explains the design and
// operations, cited here as README.md#section.
//
// # Setup
//
//   - Schema: [Migrate] at start-up of every process, or [Migrations] with goose or
//     golang-migrate (README.md#the-schema).
//   - Writing: [Add] in your transaction (README.md#writing-messages).
//   - Publishing: [NewRelay] and [Relay.Run] in as many processes as you like; [Relay.Ready]
//     for a readiness probe (README.md#running-the-relay, README.md#sizing-the-pool). Or
//     [NewWALRelay], which reads the committed rows from a logical replication slot instead
//     of polling the table ([Store.CreatePublication]; README.md#polling-or-the-wal).
//   - Operating: [RunCleanup] in one process (or [Config].DeletePublished:
//     README.md#published-rows); [ReadStats], [ListDead] and [Requeue];
//     [CommitReplicated] with synchronous standbys (README.md#operations).
//   - Your own table names or schema: [NewStore], and the same Tables in [Config].Tables
//     (README.md#your-own-table-names-and-schema). Millions of rows a day: [Tables].Partition
//     keeps the table partitioned by time, and Cleanup drops old partitions whole
//     (README.md#partitioned-tables).
//   - Tracing: [Add] records the caller's OpenTelemetry trace context, and the relay makes a
//     publish span per message (README.md#tracing). Metrics: packages outboxmetrics and
//     outboxrabbitmq/outboxrabbitmqmetrics (README.md#metrics). Tests: package outboxtest
//     (README.md#testing-your-code).
//
// # Guarantees
//
// Nothing is lost; delivery is at least once, with the same message id to deduplicate on;
// rows of one aggregate are published in the order they were written, whatever the number
// of relays; only a message's own fault costs it an attempt ([Publisher]); a poison row
// dies without stalling the rows behind it; every step is bounded in time
// ([Config].PublishTimeout, [Config].ClaimTimeout); the payload is published byte for byte.
// README.md#guarantees says how, and where each ends.
package outbox

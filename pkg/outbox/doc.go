// Package outbox is a transactional outbox for PostgreSQL (pgx v5).
//
// A service that changes its database and must tell the world about it cannot do both
// atomically: the broker is not part of the transaction. The outbox makes the message part of
// it. [Add] writes the event into the outbox table inside the caller's transaction ([AddSQL]
// through database/sql), so the business change and its events commit, or roll back,
// together. A [Relay] then publishes the committed rows through a [Publisher] (the rabbitmq
// subpackage has the RabbitMQ one) and marks them published.
//
// This documentation is the reference; the folder's README.md explains the design, and
// names its sections here as README.md#section.
//
// # Setup
//
//   - Schema: [Migrate] at start-up of every process, or [Migrations] with goose or
//     golang-migrate (README.md#the-schema).
//   - Writing: [Add] (or [AddSQL]) in your transaction; [Message.Validate] says what it
//     refuses (README.md#writing-messages).
//   - Publishing: [NewRelay] and [Relay.Run] in any process that reaches the database and
//     the broker, as many as you like; [Relay.Ready] for a readiness probe
//     (README.md#running-the-relay). Size its pool with [Relay.PoolSize]
//     (README.md#sizing-the-pool).
//   - Operating: [RunCleanup] in one process; [ReadStats], [ListDead] and [Requeue]
//     (README.md#operations). Commit what you acknowledge with [CommitReplicated] where the
//     database has synchronous standbys.
//   - Your own table names or schema: a [Store] of your [Tables] has every function above as
//     a method; give the relay the same Tables in [Config].Tables
//     (README.md#your-own-table-names-and-schema).
//
// # Guarantees
//
// Nothing is lost (a row is marked published only once the broker confirmed it, in the
// transaction that claimed it); delivery is at least once, with the same message id, for the
// consumer to deduplicate; rows of one aggregate are published in the order they were
// written, whatever the number of relays; every failure is blamed on the message, the broker
// or the database, and only the message's own fault costs it an attempt ([Publisher] lists
// how a publisher says which); a poison row dies without stalling the rows behind it; every
// step is bounded in time ([Config].PublishTimeout, [Config].ClaimTimeout); the payload is
// published byte for byte. README.md#guarantees says how, and where each ends.
//
// # Tracing, metrics, tests
//
// [Add] records the caller's OpenTelemetry trace context in the row, and the relay makes a
// publish span per message ([Config].TracerProvider), through the OpenTelemetry API only
// (README.md#tracing). The metrics subpackage turns [Hooks] and [ReadStats] into Prometheus
// metrics; outboxrabbitmq/outboxrabbitmqmetrics adds the publisher's connection (README.md#metrics). The
// outboxtest subpackage asserts on what a transaction added and has a recording [Publisher]
// (README.md#testing-your-code).
package outbox

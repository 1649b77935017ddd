// Package bench measures the outbox relay, and the inbox consumer, against the limits of the
// servers they sit between, and the relay against a peer, in one run that prints one Markdown
// table.
//
// Every figure is a ratio as well as an absolute number, and every ratio is taken against a
// figure measured in the same run, on the same machine, minutes apart: absolute numbers
// from a laptop and a CI runner cannot be compared, ratios can.
//
// # What is measured
//
//   - A, the RabbitMQ limit: persistent ~1 KiB messages with publisher confirms, a window of
//     1,000 unconfirmed per channel, on 1, 2 and 4 channels (each on its own connection).
//   - B, the PostgreSQL limit: the order transaction (an orders row and one ~1 KiB event
//     through outbox.Add, committed) with 1 to 32 writers.
//   - 3: relays (pkg/outbox Relay and its RabbitMQ publisher) draining a pre-filled backlog,
//     as a share of A with as many channels as relays, and the three steps of a cycle.
//   - 4: Watermill's forwarder (watermill-sql on pgx, watermill-amqp with confirms) draining
//     the same kind of backlog; the relay's speed as a multiple of it.
//   - 5: latency at fixed order rates from the writer's COMMIT to the broker's confirm and
//     to the warehouse's inbox commit (the warehouse's real handler and pkg/inbox consumer,
//     in this process, so that one clock takes every timestamp), with LISTEN/NOTIFY and
//     with polling only.
//   - 6: the claim and mark cost per row with 10k, 100k and 1M published rows in the table.
//   - 7: POST /orders of the orders service (in this process), driven by loadgen, as a
//     share of B.
//   - 8: the peak RSS of a relay process (bench/cmd/relay) while it drains the backlog.
//   - C, the RabbitMQ consume limit: a backlog of persistent ~1 KiB messages in a quorum
//     queue declared as the warehouse declares its own, drained by a bare amqp091-go
//     consumer with prefetch 32 that acknowledges each delivery, then every 16th with
//     multiple.
//   - 9: the inbox consumer (pkg/inbox/inboxrabbitmq, prefetch 32: a transaction per message
//     with 8 and 32 handlers, batches of 8 and 16)
//     draining the same kind of backlog into a fresh database: with a handler that does
//     nothing, then with the warehouse's real handler on orders spread over many SKUs and
//     on the five hot ones; as a share of C and of B.
//
// [Run] runs them; [Report] renders the table, and [BuildTable] its rows, with the
// targets of docs/benchmarks.md marked ✓ or ✗. A target is read off the table: it is never
// a timed test.
//
// # Isolation
//
// A run names everything it creates after a random run id: databases bench_<id>_… and
// exchanges and queues bench.<id>.…. It drops and deletes them at the end, also when it is
// interrupted, so it may run next to tests on shared servers (the figures then say how busy
// the machine was, not how fast the relay is).
package bench

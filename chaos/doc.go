// Package chaos breaks the shop on purpose while orders flow, and proves that it kept its
// promises: nothing acknowledged was lost, nothing was applied twice.
//
// A [Scenario] injects one fault — a service killed at one of its crash points
// (internal/failpoint), the broker or the orders database killed, the network to the broker
// cut or slowed, poison messages published; or an operation's fault: bad rows written into an
// outbox by hand, every process deployed again, the broker's memory alarm, a relay frozen
// with SIGSTOP, a database away for longer than the queues' delivery limit; or the orders
// database's primary killed and its synchronous standby promoted, also after the standby
// was away and the primary crash-restarted — while the load
// generator (loadgen) places orders at a steady rate with Idempotency-Keys, retrying through
// outages. Then the fault is healed, the shop drains, and e2e/verify checks every invariant
// from both databases. A
// runner's own queue on the events exchange counts the events published twice; the
// consumers' inbox_duplicates_total (or their log lines) counts the duplicates their inboxes
// absorbed. A scenario whose fault did not happen fails: it would prove nothing.
//
// # Targets
//
// [Run] runs scenarios against a [Target]. [Local] (what CI runs) builds the service
// binaries, starts private PostgreSQL servers and a private RabbitMQ node on spare ports, and
// supervises the service processes (four, or more when a scenario asks for [Replica]s), and
// gives the orders database a synchronous standby when a scenario asks for one
// ([ShopSpec].OrdersStandby), and the broker three nodes of a cluster of its own
// ([ShopSpec].BrokerCluster);
// [Compose] drives the docker compose stack.
//
// # Running
//
//	go run ./chaos/cmd/chaos run all
//	go run ./chaos/cmd/chaos run relay-after-publish -v
//
// See chaos/README.md for the scenarios and a diagram of each crash point.
package chaos

// Package postgres is the orders service's PostgreSQL adapter: the embedded migrations, and the
// Store, which writes an order, its history, its idempotency key and its events (through
// pkg/outbox) in one transaction. Connecting (and creating the database on first start) is
// internal/pgdb's, shared with the warehouse.
//
// Every transaction whose outcome the API answers, a read (GET, an idempotent replay, a
// cancellation already under way) as much as a write, commits through pgdb.InTx, that is
// outbox.CommitReplicated: on a primary with synchronous standbys nothing is answered 2xx
// until the standby has it (docs/failover.md). The consumer's transactions are pkg/inbox's,
// which commits them the same way.
package postgres

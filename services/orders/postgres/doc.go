// Package postgres is the orders service's PostgreSQL adapter: the embedded migrations, and the
// Store, which writes an order, its history, its idempotency key and its events (through
// pkg/outbox) in one transaction. Connecting (and creating the database on first start) is
// internal/pgdb's, shared with the warehouse.
package postgres

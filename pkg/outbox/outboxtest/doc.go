// Package outboxtest helps test code that uses the outbox package
// (README.md#testing-your-code): [RequireAdded], [RequireAddedMany] and [RequireNotAdded]
// assert on what a transaction added to the outbox, before it commits or instead of
// committing it, and [Publisher] is an [outbox.Publisher] without a broker, to run a relay
// against. Only the rows of the given transaction count (its savepoints' included), so tests
// may share a database and run in parallel.
package outboxtest

// The package imports only the outbox package, what that imports already (pgx, uuid) and the
// standard library, not even the testing package, so that it travels with the outbox folder.

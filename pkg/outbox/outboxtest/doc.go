// Package outboxtest helps an adopter test code that uses the outbox package: assertions on
// what a transaction added to the outbox, and a [Publisher] that records what a relay
// publishes and answers as a test scripts it.
//
// # Asserting on what a transaction added
//
// Code that calls [outbox.Add] inside a transaction can be checked before the transaction
// commits, or instead of committing it: [RequireAdded] finds the one message of the
// transaction that matches an [Expect], [RequireAddedMany] checks all of them in order, and
// [RequireNotAdded] that none matches. Only the rows the given transaction wrote count (those
// of its savepoints included), so tests may share a database and run in parallel. [Added]
// returns them without asserting.
//
// An [Expect] compares the fields it sets and ignores the others: the payload as JSON (key
// order and white space do not matter), the headers it lists. A failure names every message
// the transaction added and, for each, the fields that differ.
//
// The assertions take a [TB], the part of testing.TB they use, and an optional [Options]
// whose Tables names a non-default outbox.
//
// # A publisher for relay tests
//
// [Publisher] implements [outbox.Publisher] without a broker. It confirms every message
// unless told otherwise: [Publisher.Script] queues outcomes for the next messages (nil, an
// error, [outbox.Permanent], [outbox.ErrUnavailable], [outbox.ErrNotSent],
// [outbox.ErrRefused]), and [Publisher.Outcome] decides by message. It records every attempt
// and every confirmed message, and [Publisher.WaitPublished] waits for a number of them.
//
// The package imports only the outbox package, what that imports already (pgx, uuid) and the
// standard library, not even the testing package, so it travels with the outbox folder.
package outboxtest

// Package warehouse is the domain of the warehouse service: stock, reservations and the
// rules that connect them, with no database or broker in sight.
//
// The warehouse answers the orders service's saga (see docs/events.md at the root of the
// repository). For every OrderCreated it reserves all lines of the order or none of them
// ([DecideCreated]) and answers [StockReserved] or [StockRejected]; for every
// OrderCancelled it gives back what the order held ([DecideCancelled]) and answers
// [StockReleased]. Messages may arrive in any order and more than once; the decisions
// here are written so that every order's effect on stock happens once.
//
// # Reservation states
//
//	(none) --OrderCreated, enough stock-->  RESERVED --OrderCancelled--> RELEASED
//	(none) --OrderCreated, short/unknown--> REJECTED --OrderCancelled--> REJECTED (cancel answered)
//	(none) --OrderCancelled-------------->  CANCELLED (tombstone) --OrderCreated--> CANCELLED (rejected: order_cancelled)
//
// Anything else (a second OrderCreated for a decided order, a second OrderCancelled) changes
// nothing and emits nothing: [ActionIgnore].
//
// Decoding and validating the events it consumes is the domain's too ([DecodeOrderCreated],
// [DecodeOrderCancelled]); it knows nothing of HTTP or AMQP.
//
// The adapters live in sub-packages named after what they adapt, and reach each other only
// through the domain and small interfaces declared where they are used: postgres (the Store:
// the stock, the reservations, the answers written to the outbox, and the migrations), http
// (the HTTP API, on the Store), amqp (the topology, and the handler of the orders' events,
// which decodes a delivery here and applies it through OrderApplier, the Store as it sees
// it). The app package wires them; cmd/warehouse runs app.Command, the command line both
// services share (internal/service).
package warehouse

// Package orders is the domain of the orders service: an order, its status and the saga state
// machine of docs/events.md, the request to create one and its rules, the events the service
// publishes and consumes, and the service's error type. It knows nothing of HTTP: the wire
// form of a request and its decoding are in the http package.
//
// The adapters live in sub-packages named after what they adapt: postgres (the Store,
// migrations, the outbox writes), http (the chi router and the request decoder), amqp (the
// topology and the consumer of the warehouse's stock events). The app package wires them; cmd/orders parses the
// configuration and hands off to it.
//
// # The saga
//
//	PENDING    --StockReserved-->  RESERVED
//	PENDING    --StockRejected-->  REJECTED
//	PENDING    --cancel-->         CANCELLING (OrderCancelled)
//	RESERVED   --cancel-->         CANCELLING (OrderCancelled)
//	CANCELLING --StockReleased-->  CANCELLED
//
// Every other (status, event) pair is an illegal transition: the consumer logs and
// acknowledges it and changes nothing. See [Next].
package orders

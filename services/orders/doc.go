// Package orders is the domain of the orders service: an order, its status and the saga state
// machine of docs/events.md, the request to create one and its rules, the events the service
// publishes and consumes, the decoding and validation of the consumed ones
// ([DecodeStockEvent]), and the service's error type. It knows nothing of HTTP or AMQP: the
// wire form of a request and its decoding are in the http package, the deliveries in amqp.
//
// The adapters live in sub-packages named after what they adapt, and reach each other only
// through the domain and small interfaces declared where they are used: postgres (the Store,
// migrations, the outbox writes), http (the chi router and the request decoder, on the
// Store), amqp (the topology, and the handler of the warehouse's stock events, which decodes
// a delivery here and applies it through StockApplier, the Store as it sees it). The app
// package wires them; cmd/orders runs app.Command, the command line both services share
// (internal/service).
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

// Package billing joins the two halves of the transactional outbox and inbox: a producer
// service and a consumer service that share one RabbitMQ topology.
//
// # The path of a payment
//
// The payments service ([example.com/billing/payments]) captures a payment: the payment row
// and its PaymentCaptured event commit in one transaction, the event into the outbox. Its
// relay publishes the event, with the outbox row's id as the message id, to the exchange of
// [example.com/billing/events]. The ledger ([example.com/billing/ledger]) consumes the queue
// bound there through the inbox: the message id and the journal entry commit in one
// transaction, so that the relay publishing again after a crash, or the broker delivering
// again after a lost connection, books nothing twice.
//
// # One contract
//
// Package events names the event's type, its routing key, its payload, the exchange and
// the queues, and declares them for both sides; neither service spells a name of its own.
//
// # Running it
//
// cmd/ledger and cmd/payments are the two services (README.md); billing_test.go runs both
// against PostgreSQL and RabbitMQ, with every message published twice, and checks that each
// payment is booked once.
package billing

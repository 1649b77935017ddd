package orders

import (
	"github.com/google/uuid"
)

// MaxIdempotencyKeyLength is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKeyLength = 255

// IdempotencyKey binds a create request to its first answer.
type IdempotencyKey struct {
	// Key is the client's Idempotency-Key header.
	Key string
	// Fingerprint is OrderRequest.Fingerprint of the request: the same key with another
	// fingerprint is refused (CodeIdempotencyReuse).
	Fingerprint []byte
}

// Response is an answer to a create request as stored with its idempotency key and replayed
// for every retry with that key.
type Response struct {
	Status int
	Body   []byte
}

// CreateOrderInput is everything the repository needs to create an order.
type CreateOrderInput struct {
	Request OrderRequest
	// Meta goes into the OrderCreated event's headers.
	Meta EventMeta
	// Idempotency is nil when the request had no Idempotency-Key.
	Idempotency *IdempotencyKey
	// Render turns the created order into the answer stored with the idempotency key; it runs
	// inside the transaction. Required when Idempotency is set.
	Render func(*Order) (Response, error)
}

// CreateOrderResult is the outcome of a create request.
type CreateOrderResult struct {
	// OrderID is the created order, or the order of the replayed answer.
	OrderID uuid.UUID
	// Order is the created order; nil when the answer is replayed.
	Order *Order
	// Response is the stored answer (Idempotency set): the one just stored, or, when Replayed,
	// the first request's.
	Response *Response
	// Replayed is true when an earlier request with the same Idempotency-Key created the order
	// and nothing was written now.
	Replayed bool
}

// StockUpdate is a consumed stock event, for the repository to apply.
type StockUpdate struct {
	Event     string // EventStockReserved, EventStockRejected or EventStockReleased
	OrderID   uuid.UUID
	Reason    string // StockRejected's reason
	MessageID string
}

// StockOutcome is what applying a StockUpdate did.
type StockOutcome struct {
	// Found is false when no order has the id: nothing was written.
	Found bool
	// From is the order's status before; To is the status after (equal to From when the
	// transition was illegal).
	From, To Status
	// Applied is false for an illegal transition: nothing was written.
	Applied bool
}

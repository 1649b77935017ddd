package rabbitmq

import (
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Hooks are optional callbacks for metrics and fault injection. Nil fields are skipped. They
// are called from the consumer's goroutines, concurrently, and must return quickly: a hook
// that blocks holds up the delivery it reports on, and the worker handling it. Nothing
// recovers a hook's panic: it ends the process, as any unrecovered panic does, and the
// deliveries not yet acknowledged go back to the broker with the connection. Each takes
// one event struct, so that an event can gain fields without breaking a hook (the outbox
// relay's hooks have the same shape). An event's Type is the message's type property as
// received: it may be anything, even invalid UTF-8, so map it to a known set before using it
// as a metric label (package rabbitmqmetrics does).
type Hooks struct {
	// Processed is called after a message was committed or found in the inbox (a
	// duplicate), and its acknowledgement was sent.
	Processed func(ProcessedMessage)
	// HandlerError is called for every failed attempt: an error returned by the handler, or
	// an error of the database (begin, insert, commit), transient ones included. Use
	// inbox.Classify on its Err to tell them apart.
	HandlerError func(HandlerFailure)
	// Retried is called after a retry copy was published.
	Retried func(Retry)
	// DeadLettered is called after a message was dead-lettered and acknowledged.
	DeadLettered func(DeadLetter)
	// Held is called when a delivery starts being held after a transient failure, and when
	// the hold ends (processed, dead-lettered, handed back).
	Held func(Hold)
	// HandedBack is called when a delivery went back to the broker unprocessed.
	HandedBack func(HandBack)
	// Connected is called with Up true when the consumer starts consuming on a new
	// connection, and with Up false when it lost it (or stopped).
	Connected func(ConnectionChange)
	// Failpoint is called at FailpointBeforeCommit when a handler returned nil, and at
	// FailpointAfterCommit when its transaction committed (not for duplicates, which commit
	// nothing). A chaos test makes it kill the process. Only for tests; nil costs a nil check.
	Failpoint func(FailpointHit)
}

// ProcessedMessage is passed to [Hooks].Processed.
type ProcessedMessage struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Duplicate is true when the message was found in the inbox and skipped.
	Duplicate bool
	// Duration runs from receipt to acknowledgement.
	Duration time.Duration
	// SpanContext is the delivery's process span's context (so that a duration histogram can
	// carry the trace id as an exemplar); the zero SpanContext when no span was made.
	SpanContext trace.SpanContext
}

// HandlerFailure is passed to [Hooks].HandlerError.
type HandlerFailure struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Err is the attempt's error.
	Err error
}

// Retry is passed to [Hooks].Retried.
type Retry struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// DeliveryCount is the number of the attempt that failed.
	DeliveryCount int
}

// DeadLetter is passed to [Hooks].DeadLettered.
type DeadLetter struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Reason is one of the Reason constants.
	Reason string
}

// Hold is passed to [Hooks].Held.
type Hold struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Held is true when the hold starts, false when it ends.
	Held bool
}

// HandBack is passed to [Hooks].HandedBack.
type HandBack struct {
	// Consumer is the inbox consumer name ([Config].Name); Type the message's type property.
	Consumer, Type string
	// Reason is one of the HandBack constants.
	Reason string
}

// Reasons for handing a delivery back to the broker unprocessed, passed to
// [Hooks].HandedBack.
const (
	// HandBackHoldLimit: the delivery was held for [Config].MaxHold after transient
	// failures. The consumer republished a copy to the tail of the queue and acknowledged
	// the original: the broker does not count this as a delivery.
	HandBackHoldLimit = "hold-limit"
	// HandBackShutdown: the consumer stopped while holding the delivery. Handed back like
	// HandBackHoldLimit, uncounted.
	HandBackShutdown = "shutdown"
	// HandBackRequeued: the delivery went back by a reject with requeue, or because its
	// channel closed: it was prefetched but not started when the consumer stopped, its
	// handler was cut short by [Config].ShutdownTimeout, the broker connection was lost,
	// or the uncounted hand-back could not be published. The broker counts it (a quorum
	// queue raises x-delivery-count and applies x-delivery-limit).
	HandBackRequeued = "requeued"
)

// ConnectionChange is passed to [Hooks].Connected.
type ConnectionChange struct {
	// Consumer is the inbox consumer name ([Config].Name).
	Consumer string
	// Up is true when the consumer consumes on a connection.
	Up bool
	// Err is why the connection was lost; nil when it came up or the consumer stopped.
	Err error
	// Broker is the host:port (and vhost, unless "/") of the broker consumed from, or of the
	// one whose connection was lost. Never the credentials.
	Broker string
}

// FailpointHit is passed to [Hooks].Failpoint.
type FailpointHit struct {
	// Name is the point reached, one of the Failpoint constants.
	Name string
}

// Failpoint names passed to [Hooks].Failpoint. A chaos test makes the hook kill the process
// at one of them to prove that no crash loses or doubles an effect.
const (
	// FailpointBeforeCommit: the handler returned nil; its changes and the inbox row are in
	// the open transaction, not committed. A crash here rolls them back, the message is
	// redelivered and processed again.
	FailpointBeforeCommit = "consumer.before-commit"
	// FailpointAfterCommit: the transaction committed; the message is not acknowledged yet.
	// A crash here makes the broker redeliver it, and the inbox reports a duplicate.
	FailpointAfterCommit = "consumer.after-commit"
)

// hookHeld calls Hooks.Held, if set: held is true when a hold starts, false when it ends.
func (c *Consumer) hookHeld(msgType string, held bool) {
	if h := c.cfg.Hooks.Held; h != nil {
		h(Hold{Consumer: c.cfg.Name, Type: msgType, Held: held})
	}
}

// hookHandedBack calls Hooks.HandedBack, if set, with one of the HandBack reasons.
func (c *Consumer) hookHandedBack(msgType, reason string) {
	if h := c.cfg.Hooks.HandedBack; h != nil {
		h(HandBack{Consumer: c.cfg.Name, Type: msgType, Reason: reason})
	}
}

// hookConnected calls Hooks.Connected, if set.
func (c *Consumer) hookConnected(up bool, err error, broker string) {
	if h := c.cfg.Hooks.Connected; h != nil {
		h(ConnectionChange{Consumer: c.cfg.Name, Up: up, Err: err, Broker: broker})
	}
}

// failpoint calls Hooks.Failpoint, if set, with one of the Failpoint names.
func (c *Consumer) failpoint(name string) {
	if f := c.cfg.Hooks.Failpoint; f != nil {
		f(FailpointHit{Name: name})
	}
}

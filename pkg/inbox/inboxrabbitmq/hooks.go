package inboxrabbitmq

import (
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Hooks are optional callbacks, for metrics and tests. A hook may be called from any of the
// consumer's goroutines, concurrently with other hooks: make it safe for concurrent use, and
// fast (a slow hook holds up the delivery it reports on, and the worker handling it). A hook
// that panics ends the process, as any unrecovered panic does; the deliveries not yet
// acknowledged go back to the broker with the connection.
//
// Nil hooks are skipped. Each takes one event struct, so that an event can gain fields. Every
// event names the Consumer ([Config].Name), and most the message's Type property as received:
// anything, even invalid UTF-8, so map it to a known set before using it as a metric label.
type Hooks struct {
	// Processed is called after a message was committed or found in the inbox (a
	// duplicate), and its acknowledgement was sent.
	Processed func(ProcessedMessage)
	// HandlerError is called for every failed attempt, the handler's or the database's,
	// transient ones included (inbox.Classify tells them apart).
	HandlerError func(HandlerFailure)
	// Retried is called after a retry copy was published.
	Retried func(Retry)
	// DeadLettered is called after a message was dead-lettered and acknowledged.
	DeadLettered func(DeadLetter)
	// Held is called when a delivery's hold starts, after a transient failure, and ends.
	Held func(Hold)
	// HandedBack is called when a delivery went back to the broker unprocessed.
	HandedBack func(HandBack)
	// Connected is called when the consumer starts consuming on a connection, and when it
	// lost it or stopped.
	Connected func(ConnectionChange)
	// Failpoint is called at each of the Failpoint constants, for a chaos test to kill the
	// process there and prove that no crash loses or doubles an effect.
	Failpoint func(FailpointHit)
}

// ProcessedMessage is passed to [Hooks].Processed.
type ProcessedMessage struct {
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
	Consumer, Type string
	// Err is the attempt's error.
	Err error
}

// Retry is passed to [Hooks].Retried.
type Retry struct {
	Consumer, Type string
	// DeliveryCount is the number of the attempt that failed.
	DeliveryCount int
}

// DeadLetter is passed to [Hooks].DeadLettered.
type DeadLetter struct {
	Consumer, Type string
	// Reason is one of the Reason constants.
	Reason string
}

// Hold is passed to [Hooks].Held.
type Hold struct {
	Consumer, Type string
	// Held is true when the hold starts, false when it ends.
	Held bool
}

// HandBack is passed to [Hooks].HandedBack.
type HandBack struct {
	Consumer, Type string
	// Reason is one of the HandBack constants.
	Reason string
}

// Reasons for handing a delivery back to the broker unprocessed, passed to
// [Hooks].HandedBack.
const (
	// HandBackHoldLimit: held for [Config].MaxHold, the delivery was republished to the tail
	// of the queue and the original acknowledged, which the broker does not count.
	HandBackHoldLimit = "hold-limit"
	// HandBackShutdown: the consumer stopped while holding it; handed back the same way.
	HandBackShutdown = "shutdown"
	// HandBackRequeued: rejected with requeue, or left to the broker with its channel
	// (prefetched but not started at a stop, cut short by [Config].ShutdownTimeout, the
	// connection lost, or the uncounted hand-back failed): the broker counts a delivery.
	HandBackRequeued = "requeued"
)

// ConnectionChange is passed to [Hooks].Connected.
type ConnectionChange struct {
	Consumer string
	// Up is true when the consumer consumes on a connection; Err is why it was lost (nil
	// when it came up or the consumer stopped).
	Up  bool
	Err error
	// Broker is the host:port (and vhost, unless "/") of the broker, never the credentials.
	Broker string
}

// FailpointHit is passed to [Hooks].Failpoint.
type FailpointHit struct {
	// Name is the point reached, one of the Failpoint constants.
	Name string
}

// Failpoint names passed to [Hooks].Failpoint.
const (
	// FailpointBeforeCommit: the handler returned nil, nothing is committed yet. A crash
	// here rolls back; the redelivery is processed again. In a batch it comes after each
	// message's handler: a crash there rolls back the whole batch, the messages handled
	// before it and those not handled yet alike.
	FailpointBeforeCommit = "consumer.before-commit"
	// FailpointAfterCommit: committed (not a duplicate), not acknowledged yet. A crash here
	// makes the broker redeliver the message, a duplicate for the inbox. In a batch it comes
	// once per message committed, before any of the batch is acknowledged.
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

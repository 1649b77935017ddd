package inboxtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
)

// TB is the part of testing.TB the assertions use; *testing.T and *testing.B satisfy it.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

// Options configure a delivery. A nil *Options is the zero value.
type Options struct {
	// BeforeCommit, when set, is called inside the transaction after the handler returned
	// nil, before the commit: a test asserts there on what the handler wrote. It is not
	// called for a duplicate nor when the handler failed.
	BeforeCommit func(ctx context.Context, tx pgx.Tx)
}

// Result is what became of one delivery through [inbox.Process].
type Result struct {
	// Duplicate is true when the inbox had the message already: the handler was not called
	// and nothing was written.
	Duplicate bool
	// Called is true when the handler ran (or would have: a nil handler is allowed).
	Called bool
	// Err is what Process returned: nil when the transaction committed (or for a duplicate).
	Err error
	// Class is inbox.Classify(Err), what a runner does with a failure: retry without
	// counting (ClassTransient), dead-letter at once (ClassPermanent), or count an attempt
	// (ClassFailed). Meaningless when Err is nil.
	Class inbox.Class
}

// Deliver runs fn on msg for consumer through [inbox.Process] on db, as a consumer does for a
// delivery, and reports the outcome. Deliver the same message again to see what a redelivery
// does.
func Deliver(ctx context.Context, db inbox.TxBeginner, consumer string, msg inbox.Message,
	fn func(ctx context.Context, tx pgx.Tx) error, opts *Options) Result {
	if opts == nil {
		opts = &Options{}
	}
	var r Result
	r.Duplicate, r.Err = inbox.Process(ctx, db, consumer, msg, func(ctx context.Context, tx pgx.Tx) error {
		r.Called = true
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		if opts.BeforeCommit != nil {
			opts.BeforeCommit(ctx, tx)
		}
		return nil
	})
	if r.Err != nil {
		r.Class = inbox.Classify(r.Err)
	}
	return r
}

// RequireProcessed asserts that r is a delivery whose handler ran and committed.
func (r Result) RequireProcessed(t TB) {
	t.Helper()
	switch {
	case r.Err != nil:
		t.Errorf("inboxtest: want the message processed, got error (%s): %v", r.Class, r.Err)
	case r.Duplicate:
		t.Errorf("inboxtest: want the message processed, got a duplicate: the inbox had it already")
	case !r.Called:
		t.Errorf("inboxtest: want the message processed, but the handler was not called")
	default:
		return
	}
	t.FailNow()
}

// RequireDuplicate asserts that r is a delivery the inbox recognised as a duplicate, without
// calling the handler.
func (r Result) RequireDuplicate(t TB) {
	t.Helper()
	switch {
	case r.Err != nil:
		t.Errorf("inboxtest: want a duplicate, got error (%s): %v", r.Class, r.Err)
	case r.Called:
		t.Errorf("inboxtest: want a duplicate, but the handler was called")
	case !r.Duplicate:
		t.Errorf("inboxtest: want a duplicate, but the delivery was processed")
	default:
		return
	}
	t.FailNow()
}

// RequireError asserts that r failed with an error of class want, and returns the error.
func (r Result) RequireError(t TB, want inbox.Class) error {
	t.Helper()
	switch {
	case r.Err == nil && r.Duplicate:
		t.Errorf("inboxtest: want a %s error, got a duplicate", want)
	case r.Err == nil:
		t.Errorf("inboxtest: want a %s error, got the message processed", want)
	case r.Class != want:
		t.Errorf("inboxtest: want a %s error, got a %s one: %v", want, r.Class, r.Err)
	default:
		return r.Err
	}
	t.FailNow()
	return nil
}

// RequireProcessedOnce delivers msg twice: it asserts that the first delivery ran fn and
// committed, and that the second was a duplicate that did not call fn. It returns the first
// delivery's result.
func RequireProcessedOnce(ctx context.Context, t TB, db inbox.TxBeginner, consumer string, msg inbox.Message,
	fn func(ctx context.Context, tx pgx.Tx) error, opts *Options) Result {
	t.Helper()
	first := Deliver(ctx, db, consumer, msg, fn, opts)
	first.RequireProcessed(t)
	Deliver(ctx, db, consumer, msg, fn, opts).RequireDuplicate(t)
	return first
}

// Outcome is what the RabbitMQ consumer does with a delivery after its handler ran.
type Outcome string

// The outcomes of [DeliverRabbitMQ].
const (
	// Acked: the transaction committed and the delivery is acknowledged.
	Acked Outcome = "acked"
	// AckedDuplicate: the inbox had the message; acknowledged without calling the handler.
	AckedDuplicate Outcome = "acked-duplicate"
	// Held: a transient failure. The consumer keeps the delivery and calls the handler again
	// in place, after a backoff, without counting an attempt.
	Held Outcome = "held"
	// Retried: a failed attempt that counts. A copy with DeliveryCount+1 goes back to the
	// queue after a backoff.
	Retried Outcome = "retried"
	// DeadLettered: the message goes to the dead-letter destination with [Handled].Reason.
	DeadLettered Outcome = "dead-lettered"
)

// Handled is what became of one delivery through the RabbitMQ consumer's handling.
type Handled struct {
	Result
	// Outcome is what the consumer does next; empty when cfg.Name is invalid.
	Outcome Outcome
	// Reason is the dead-letter reason (one of the rabbitmq.Reason constants) when Outcome
	// is DeadLettered.
	Reason string
}

// DeliverRabbitMQ runs cfg.Handler on d through the inbox as consumer cfg.Name, as the
// RabbitMQ consumer built from cfg does, and reports the outcome the consumer would reach.
// What the consumer dead-letters before its transaction ([rabbitmq.Config.Refusal]: cfg.Types,
// cfg.ContentTypes, cfg.MaxBodyBytes, a body that is not JSON while the content type says it
// is, or is empty) is DeadLettered without calling the handler, with a permanent Err naming
// the reason. cfg.MaxDeliveries (default rabbitmq.DefaultMaxDeliveries) and d.DeliveryCount
// (0 counts as the first attempt) decide between Retried and DeadLettered for a counted
// failure. The other fields of cfg, the broker's among them, are not used. An invalid cfg.Name, with
// which the consumer would not start, gives no Outcome and an Err saying so.
func DeliverRabbitMQ(ctx context.Context, db inbox.TxBeginner, cfg rabbitmq.Config, d rabbitmq.Delivery, opts *Options) Handled {
	if err := inbox.ValidateConsumer(cfg.Name); err != nil {
		// The consumer would not start; there is no outcome.
		return Handled{Result: Result{Err: fmt.Errorf("inboxtest: rabbitmq.Config.Name: %w", err)}}
	}
	d.DeliveryCount = max(d.DeliveryCount, 1)
	maxDeliveries := cfg.MaxDeliveries
	if maxDeliveries <= 0 {
		maxDeliveries = rabbitmq.DefaultMaxDeliveries
	}
	msg := inbox.Message{ID: d.ID, Type: d.Type}
	if err := msg.Validate(); err != nil {
		reason := rabbitmq.ReasonInvalidMessageID
		switch {
		case errors.Is(err, inbox.ErrNoMessageID):
			reason = rabbitmq.ReasonMissingMessageID
		case errors.Is(err, inbox.ErrInvalidMessageType):
			reason = rabbitmq.ReasonInvalidMessageType
		}
		return Handled{Result: Result{Err: err, Class: inbox.Classify(err)}, Outcome: DeadLettered, Reason: reason}
	}
	if reason, detail := cfg.Refusal(d); reason != "" {
		// Dead-lettered before a transaction, as the consumer does: the handler does not run.
		err := inbox.Permanent(fmt.Errorf("%s: %s", reason, detail))
		return Handled{Result: Result{Err: err, Class: inbox.Classify(err)}, Outcome: DeadLettered, Reason: reason}
	}
	var handler func(ctx context.Context, tx pgx.Tx) error
	if cfg.Handler != nil {
		handler = func(ctx context.Context, tx pgx.Tx) error { return callHandler(ctx, tx, cfg.Handler, d) }
	}
	h := Handled{Result: Deliver(ctx, db, cfg.Name, msg, handler, opts)}
	switch {
	case h.Err == nil && h.Duplicate:
		h.Outcome = AckedDuplicate
	case h.Err == nil:
		h.Outcome = Acked
	case h.Class == inbox.ClassTransient:
		h.Outcome = Held
	case h.Class == inbox.ClassPermanent:
		h.Outcome, h.Reason = DeadLettered, rabbitmq.ReasonPermanent
	case d.DeliveryCount >= maxDeliveries:
		h.Outcome, h.Reason = DeadLettered, rabbitmq.ReasonMaxDeliveries
	default:
		h.Outcome = Retried
	}
	return h
}

// callHandler runs h and turns a panic into an error, as the consumer does.
func callHandler(ctx context.Context, tx pgx.Tx, h rabbitmq.Handler, d rabbitmq.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("handler panicked: %w", e)
			} else {
				err = fmt.Errorf("handler panicked: %v", r)
			}
		}
	}()
	return h(ctx, tx, d)
}

// RequireOutcome asserts that the consumer reaches want with h, and, for DeadLettered, the
// dead-letter reason, when reason is not empty.
func (h Handled) RequireOutcome(t TB, want Outcome, reason string) {
	t.Helper()
	if h.Outcome == want && (reason == "" || h.Reason == reason) {
		return
	}
	got := string(h.Outcome)
	if got == "" {
		got = "no outcome"
	}
	if h.Reason != "" {
		got += " (" + h.Reason + ")"
	}
	if want == DeadLettered && reason != "" {
		want += Outcome(" (" + reason + ")")
	}
	if h.Err != nil {
		t.Errorf("inboxtest: want the delivery %s, got %s after a %s error: %v", want, got, h.Class, h.Err)
	} else {
		t.Errorf("inboxtest: want the delivery %s, got %s", want, got)
	}
	t.FailNow()
}

// RequireHandledOnce delivers d twice to the handler of cfg: it asserts that the first
// delivery was acknowledged after the handler committed, and that the second was
// acknowledged as a duplicate without calling the handler. It returns the first delivery's
// result.
func RequireHandledOnce(ctx context.Context, t TB, db inbox.TxBeginner, cfg rabbitmq.Config, d rabbitmq.Delivery, opts *Options) Handled {
	t.Helper()
	first := DeliverRabbitMQ(ctx, db, cfg, d, opts)
	first.RequireOutcome(t, Acked, "")
	second := DeliverRabbitMQ(ctx, db, cfg, d, opts)
	second.RequireOutcome(t, AckedDuplicate, "")
	if second.Called {
		t.Errorf("inboxtest: the duplicate delivery called the handler")
		t.FailNow()
	}
	return first
}

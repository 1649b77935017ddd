package inboxrabbitmqtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/internal/decide"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxtest"
)

// Outcome is what the RabbitMQ consumer does with a delivery after its handler ran.
type Outcome string

// The outcomes of [Deliver].
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
	inboxtest.Result
	// Outcome is what the consumer does next; empty when cfg.Name or cfg.Tables is invalid.
	Outcome Outcome
	// Reason is the dead-letter reason (one of the inboxrabbitmq.Reason constants) when Outcome
	// is DeadLettered.
	Reason string
}

// Deliver runs cfg.Handler on d through the inbox of cfg.Tables as consumer cfg.Name, as the
// RabbitMQ consumer built from cfg does, and reports the outcome the consumer would reach.
// What the consumer dead-letters before its transaction (for cfg.Types, cfg.ContentTypes,
// cfg.MaxMessageBytes, a body that is not JSON while the content type says it is, or is
// empty) is DeadLettered without calling the handler, with a permanent Err naming the
// reason: the consumer's own checks decide it. cfg.MaxDeliveries (default inboxrabbitmq.DefaultMaxDeliveries) and d.DeliveryCount
// (0 counts as the first attempt) decide between Retried and DeadLettered for a counted
// failure. The other fields of cfg, the broker's among them, are not used. An invalid
// cfg.Name or cfg.Tables, with which the consumer would not start, gives no Outcome and an
// Err saying so.
//
// opts is passed on to [inboxtest.Deliver]; its Tables must be left zero or equal cfg.Tables,
// since the consumer records messages in cfg.Tables.
func Deliver(ctx context.Context, db inbox.TxBeginner, cfg inboxrabbitmq.Config, d inboxrabbitmq.Delivery, opts *inboxtest.Options) Handled {
	if err := inbox.ValidateConsumer(cfg.Name); err != nil {
		// The consumer would not start; there is no outcome.
		return Handled{Result: inboxtest.Result{Err: fmt.Errorf("inboxrabbitmq.Config.Name: %w", err)}}
	}
	if err := cfg.Tables.Validate(); err != nil {
		return Handled{Result: inboxtest.Result{Err: fmt.Errorf("inboxrabbitmq.Config.Tables: %w", err)}}
	}
	o := inboxtest.Options{Tables: cfg.Tables}
	if opts != nil {
		if opts.Tables != (inbox.Tables{}) && opts.Tables.WithDefaults() != cfg.Tables.WithDefaults() {
			return Handled{Result: inboxtest.Result{Err: fmt.Errorf(
				"inboxrabbitmqtest: Options.Tables %s is not inboxrabbitmq.Config.Tables %s: the consumer records messages in the latter",
				opts.Tables, cfg.Tables)}}
		}
		o.BeforeCommit = opts.BeforeCommit
	}
	d.DeliveryCount = max(d.DeliveryCount, 1)
	// The consumer's defaults, for the fields used here; the others need not be set.
	maxDeliveries, maxMessageBytes := cfg.MaxDeliveries, cfg.MaxMessageBytes
	if maxDeliveries <= 0 {
		maxDeliveries = inboxrabbitmq.DefaultMaxDeliveries
	}
	if maxMessageBytes <= 0 {
		maxMessageBytes = inboxrabbitmq.DefaultMaxMessageBytes
	}
	reasons := inboxrabbitmq.Reasons() // indexed by decide.Reason
	msg := inbox.Message{ID: d.ID, Type: d.Type}
	if err := msg.Validate(); err != nil {
		return Handled{Result: inboxtest.Result{Err: err, Class: inbox.Classify(err)}, Outcome: DeadLettered,
			Reason: reasons[decide.InvalidMessage(err)]}
	}
	if r, detail := decide.Refusal(decide.Message{ID: d.ID, Type: d.Type, ContentType: d.ContentType, Body: d.Body},
		decide.Acceptance{MaxMessageBytes: maxMessageBytes, ContentTypes: decide.MediaTypes(cfg.ContentTypes), Types: cfg.Types},
	); r != decide.NoReason {
		// Dead-lettered before a transaction, as the consumer does: the handler does not run.
		err := inbox.Permanent(fmt.Errorf("%s: %s", reasons[r], detail))
		return Handled{Result: inboxtest.Result{Err: err, Class: inbox.Classify(err)}, Outcome: DeadLettered, Reason: reasons[r]}
	}
	var handler func(ctx context.Context, tx pgx.Tx) error
	if cfg.Handler != nil {
		handler = func(ctx context.Context, tx pgx.Tx) error { return callHandler(ctx, tx, cfg.Handler, d) }
	}
	h := Handled{Result: inboxtest.Deliver(ctx, db, cfg.Name, msg, handler, &o)}
	if h.Err == nil {
		h.Outcome = Acked
		if h.Duplicate {
			h.Outcome = AckedDuplicate
		}
		return h
	}
	switch step, r := decide.AfterFailure(false, h.Class, d.DeliveryCount, maxDeliveries); step {
	case decide.Hold:
		h.Outcome = Held
	case decide.DeadLetter:
		h.Outcome, h.Reason = DeadLettered, reasons[r]
	default:
		h.Outcome = Retried
	}
	return h
}

// callHandler runs h and turns a panic into an error, as the consumer does.
func callHandler(ctx context.Context, tx pgx.Tx, h inboxrabbitmq.Handler, d inboxrabbitmq.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = decide.PanicError(r)
		}
	}()
	return h(ctx, tx, d)
}

// RequireOutcome asserts that the consumer reaches want with h, and, for DeadLettered, the
// dead-letter reason, when reason is not empty.
func (h Handled) RequireOutcome(t inboxtest.TB, want Outcome, reason string) {
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
		t.Errorf("inboxrabbitmqtest: want the delivery %s, got %s after a %s error: %v", want, got, h.Class, h.Err)
	} else {
		t.Errorf("inboxrabbitmqtest: want the delivery %s, got %s", want, got)
	}
	t.FailNow()
}

// RequireHandledOnce delivers d twice to the handler of cfg: it asserts that the first
// delivery was acknowledged after the handler committed, and that the second was
// acknowledged as a duplicate without calling the handler. It returns the first delivery's
// result.
func RequireHandledOnce(ctx context.Context, t inboxtest.TB, db inbox.TxBeginner, cfg inboxrabbitmq.Config, d inboxrabbitmq.Delivery, opts *inboxtest.Options) Handled {
	t.Helper()
	first := Deliver(ctx, db, cfg, d, opts)
	first.RequireOutcome(t, Acked, "")
	second := Deliver(ctx, db, cfg, d, opts)
	second.RequireOutcome(t, AckedDuplicate, "")
	if second.Called {
		t.Errorf("inboxrabbitmqtest: the duplicate delivery called the handler")
		t.FailNow()
	}
	return first
}

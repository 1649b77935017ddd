package inboxtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox"
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
	// Tables names the inbox to record the message in, as the consumer's own does
	// ([inbox.Store]); the zero value is the default inbox_messages. An invalid value makes
	// the delivery fail with an error wrapping [inbox.ErrInvalidTables], without calling the
	// handler.
	Tables inbox.Tables
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
	// Class is inbox.Classify(Err), what a runner does with the failure. Meaningless when Err
	// is nil.
	Class inbox.Class
}

// Deliver runs fn on msg for consumer through [inbox.Store.Process] of [Options].Tables on db,
// as a consumer does for a delivery, and reports the outcome. Deliver the same message again
// to see what a redelivery does.
func Deliver(ctx context.Context, db inbox.TxBeginner, consumer string, msg inbox.Message,
	fn func(ctx context.Context, tx pgx.Tx) error, opts *Options) Result {
	if opts == nil {
		opts = &Options{}
	}
	store, err := inbox.NewStore(opts.Tables)
	if err != nil {
		err = fmt.Errorf("inboxtest.Options.Tables: %w", err)
		return Result{Err: err, Class: inbox.Classify(err)}
	}
	var r Result
	r.Duplicate, r.Err = store.Process(ctx, db, consumer, msg, func(ctx context.Context, tx pgx.Tx) error {
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

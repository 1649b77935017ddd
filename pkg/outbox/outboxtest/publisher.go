package outboxtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// Publisher is an [outbox.Publisher] for tests: it sends nothing, records every message it is
// given and reports for each the outcome a test chose. The zero value confirms every message;
// it is safe for concurrent use, by several relays too. For each message, the outcome is, in
// this order:
//
//   - a wrapped [outbox.ErrNotSent] when ctx's deadline has passed (a real publisher must not
//     confirm what it did not send);
//   - an [outbox.Permanent] error when the message fails [outbox.Message.Validate], as the
//     RabbitMQ publisher does;
//   - the next outcome queued with [Publisher.Script];
//   - what [Publisher.Outcome] returns, when set;
//   - nil: confirmed, and recorded as published.
type Publisher struct {
	// Outcome, when set, decides the outcome of every message no scripted outcome is left for.
	// Set it before the publisher is used. It is called with the publisher locked: it must
	// not call the publisher's methods.
	Outcome func(m outbox.Message) error

	mu        sync.Mutex
	script    []error
	attempts  []Attempt
	published []outbox.Message
	changed   chan struct{} // closed and replaced when a message is recorded
}

// Attempt is one message given to [Publisher.Publish] and the outcome reported for it.
type Attempt struct {
	Message outbox.Message
	Err     error
}

var _ outbox.Publisher = (*Publisher)(nil)

// Script queues outcomes for the next messages, one each, in the order they are published:
// nil confirms, and the relay reads an error as [outbox.Publisher] says.
func (p *Publisher) Script(outcomes ...error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = append(p.script, outcomes...)
}

// Publish implements [outbox.Publisher].
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = p.outcome(ctx, m)
		m.Payload, m.Headers = slices.Clone(m.Payload), maps.Clone(m.Headers)
		p.attempts = append(p.attempts, Attempt{Message: m, Err: errs[i]})
		if errs[i] == nil {
			p.published = append(p.published, m)
		}
	}
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
	return errs
}

// outcome decides what Publish reports for m. p.mu is held.
func (p *Publisher) outcome(ctx context.Context, m outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", outbox.ErrNotSent, err)
	}
	if err := m.Validate(); err != nil {
		return outbox.Permanent(err)
	}
	if len(p.script) > 0 {
		err := p.script[0]
		p.script = p.script[1:]
		return err
	}
	if p.Outcome != nil {
		return p.Outcome(m)
	}
	return nil
}

// Published returns the messages confirmed so far, in the order they were published.
func (p *Publisher) Published() []outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.published)
}

// Attempts returns every message given to Publish so far, with the outcome reported.
func (p *Publisher) Attempts() []Attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.attempts)
}

// WaitPublished waits until at least n messages were confirmed and returns the confirmed
// messages, or returns ctx's error with those confirmed so far.
func (p *Publisher) WaitPublished(ctx context.Context, n int) ([]outbox.Message, error) {
	for {
		p.mu.Lock()
		if len(p.published) >= n {
			defer p.mu.Unlock()
			return slices.Clone(p.published), nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return p.Published(), fmt.Errorf("outboxtest: wait for %d published messages: %w", n, ctx.Err())
		}
	}
}

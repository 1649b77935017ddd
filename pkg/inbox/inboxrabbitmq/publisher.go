package inboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publisher publishes retry copies and dead letters on a second channel of the consumer's
// connection, in confirm mode, one message at a time: a publish succeeds only when the broker
// confirmed it and did not return it as unroutable. The consumer acknowledges the original
// only after that.
type publisher struct {
	conn    *amqp.Connection
	timeout time.Duration

	mu      sync.Mutex // serialises publishes, so the return of a message precedes its confirm
	ch      *amqp.Channel
	returns chan amqp.Return
}

// open opens the confirm channel. The caller holds mu, or is the only user.
func (p *publisher) open() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	p.ch = ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	return nil
}

// publish publishes msg with the mandatory flag and waits for the broker's confirm, at most
// p.timeout. A channel that failed (a channel error such as a missing exchange closes it) is
// reopened on the next publish. It makes one attempt: a failed publish is a transient
// failure of its delivery's stage, which handle retries after the hold's backoff.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil || p.ch.IsClosed() {
		if err := p.open(); err != nil {
			return err
		}
	}
	p.drainReturns()

	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	confirm, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	acked, err := confirm.WaitContext(ctx)
	if err != nil {
		// The confirm may still come; a fresh channel keeps it from being taken for the next
		// message's.
		_ = p.ch.Close()
		p.ch = nil
		return fmt.Errorf("wait for publisher confirm: %w", err)
	}
	if !acked {
		if p.ch.IsClosed() {
			return errors.New("publish channel closed before the broker confirmed (missing exchange?)")
		}
		// A nack may come from the channel's own view of a queue (RabbitMQ 3.10 nacks every
		// publish of a channel that first sent to a quorum queue while its leader's node was
		// down, long after another replica took over): the next publish opens a new channel.
		_ = p.ch.Close()
		p.ch = nil
		return errors.New("the broker refused the message (nack)")
	}
	// The broker sends basic.return before the confirm of an unroutable mandatory message,
	// and the library hands it over before it completes the confirm.
	select {
	case r, ok := <-p.returns:
		if ok {
			return fmt.Errorf("unroutable: %d %s (exchange %q, routing key %q)", r.ReplyCode, r.ReplyText, exchange, key)
		}
	default:
	}
	return nil
}

// drainReturns discards the returns of earlier publishes. Not a retry loop: it never waits,
// and ends when the channel is empty.
func (p *publisher) drainReturns() {
	for {
		select {
		case _, ok := <-p.returns:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// Package rabbitmq publishes outbox messages to RabbitMQ with publisher confirms.
//
// [Publisher] implements outbox.Publisher. A batch goes out on one confirm-mode channel with
// every message in flight at once, and each message's fate is read from its own confirm:
//
//   - ack, and no basic.return: published (nil);
//   - basic.return (mandatory, routed to no queue): an error wrapping [ErrUnroutable];
//   - nack: an error wrapping [ErrNacked];
//   - no confirm before the deadline, or the connection closed first: outbox.ErrUnavailable.
//     Such a message is never reported as published.
//
// Messages are persistent, mandatory, and carry the outbox id as message-id, the event type,
// the creation time as timestamp, content type application/json, the correlation id, and the
// outbox headers plus aggregate_type and aggregate_id.
//
// The publisher connects lazily and again after the connection or channel closed: each
// Publish call first makes sure it has an open channel (an explicit supervisor; amqp091-go's
// own recovery is not used, so every reconnect is visible here and in [Hooks]).
package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

var (
	// ErrUnroutable: the broker returned the message because no queue is bound for it.
	ErrUnroutable = errors.New("unroutable")
	// ErrNacked: the broker refused the message (a full queue with reject-publish, say).
	ErrNacked = errors.New("nacked by broker")
)

var _ outbox.Publisher = (*Publisher)(nil)

// Config configures a [Publisher].
type Config struct {
	// URL is the broker, e.g. amqp://guest:guest@localhost:5672/.
	URL string
	// ConnectionName shows in the management UI. Default "outbox-relay".
	ConnectionName string
	// DialTimeout bounds connecting, and closing a connection the broker stopped answering
	// on. Default 5s.
	DialTimeout time.Duration
	// Setup runs on every new channel, before the first publish: declare the exchanges the
	// outbox publishes to there, so a restarted broker without them is repaired. Optional.
	Setup func(ch *amqp.Channel) error
	// Logger receives connection changes. nil discards.
	Logger *slog.Logger
	// Hooks observe the connection.
	Hooks Hooks
}

// Hooks are optional callbacks for metrics.
type Hooks struct {
	// Connected is called with true after every successful (re)connect, and with false when
	// a connection is lost or a dial fails.
	Connected func(up bool)
}

// Publisher publishes batches of outbox messages on one channel. It is safe for concurrent
// use; batches are sent one after the other.
type Publisher struct {
	cfg Config

	mu      sync.Mutex // serialises Publish and guards the fields below
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error // the channel's close notification
	up      bool
}

// New returns a Publisher. It does not connect: the first Publish does.
func New(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq publisher: empty URL")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("rabbitmq publisher: %w", err)
	}
	cfg.ConnectionName = cmp.Or(cfg.ConnectionName, "outbox-relay")
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, 5*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg}, nil
}

// Close closes the connection. A later Publish connects again.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resetLocked()
}

// Publish sends msgs and waits for their confirms; see the package documentation for the
// meaning of each returned error.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	if err := p.ensureChannelLocked(); err != nil {
		fill(errs, 0, fmt.Errorf("%w: %v", outbox.ErrUnavailable, err))
		return errs
	}

	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	sent := len(msgs)
	for i, m := range msgs {
		dc, err := p.ch.PublishWithDeferredConfirm(m.Exchange, m.RoutingKey, true, false, publishing(m))
		if err != nil {
			if errors.Is(err, amqp.ErrFieldType) {
				errs[i] = outbox.Permanent(fmt.Errorf("encode headers: %w", err))
				continue
			}
			// The channel or connection is gone; nothing after this was sent.
			sent = i
			break
		}
		confirms[i] = dc
	}

	// Wait for every confirm, collecting returns as they come. RabbitMQ sends a message's
	// basic.return before its ack, and amqp091-go hands both over from one goroutine in
	// that order; so once the last ack is in, every return is in p.returns or already read.
	returned := map[string]string{}
	returns := p.returns // nil once closed: a closed channel would be read for ever
	takeReturn := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
	}
	timedOut := false
wait:
	for i := 0; i < sent; i++ {
		if confirms[i] == nil {
			continue
		}
		for {
			select {
			case r, ok := <-returns:
				takeReturn(r, ok)
				continue
			case <-confirms[i].Done():
			case <-ctx.Done():
				timedOut = true
				break wait
			}
			break
		}
	}
	for returns != nil {
		select {
		case r, ok := <-returns:
			takeReturn(r, ok)
		default:
			returns = nil
		}
	}

	var closeErr *amqp.Error
	select {
	case closeErr = <-p.closed:
	default:
	}
	channelGone := closeErr != nil || p.ch.IsClosed()
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		dc := confirms[i]
		switch {
		case i >= sent:
			errs[i] = p.closedError(closeErr, outbox.Message{}) // never sent: never its fault
		case dc == nil:
			errs[i] = fmt.Errorf("%w: no confirmation", outbox.ErrUnavailable)
		case !isDone(dc):
			errs[i] = fmt.Errorf("%w: no confirm within the deadline: %v", outbox.ErrUnavailable, ctx.Err())
		case dc.Acked():
			if reason, ok := returned[msgs[i].ID.String()]; ok {
				errs[i] = fmt.Errorf("%w: %s", ErrUnroutable, reason)
			}
		case channelGone:
			// amqp091-go nacks every pending confirm when the channel closes: that is
			// not the broker's verdict on the message.
			errs[i] = p.closedError(closeErr, msgs[i])
		default:
			errs[i] = ErrNacked
		}
	}
	if timedOut || channelGone || sent < len(msgs) {
		// Confirms may still be owed on this channel; start the next batch on a fresh one.
		_ = p.resetLocked()
	}
	return errs
}

// closedError classifies a message that was unconfirmed when its channel closed. A channel
// closed by a soft error (the broker refusing one message, e.g. 404 no such exchange) leaves
// the connection open: the message it names fails, the others were merely not sent. Anything
// else is an outage.
func (p *Publisher) closedError(closeErr *amqp.Error, m outbox.Message) error {
	if closeErr == nil || closeErr.Server && !closeErr.Recover || p.conn == nil || p.conn.IsClosed() {
		return fmt.Errorf("%w: channel closed: %v", outbox.ErrUnavailable, closeErr)
	}
	if m.Exchange != "" && strings.Contains(closeErr.Reason, "'"+m.Exchange+"'") {
		return fmt.Errorf("channel closed by broker: %s", closeErr.Reason)
	}
	return fmt.Errorf("%w: channel closed by broker: %s", outbox.ErrNotSent, closeErr.Reason)
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

func fill(errs []error, from int, err error) {
	for i := from; i < len(errs); i++ {
		errs[i] = err
	}
}

func publishing(m outbox.Message) amqp.Publishing {
	headers := make(amqp.Table, len(m.Headers)+2)
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers["aggregate_type"] = m.AggregateType
	headers["aggregate_id"] = m.AggregateID
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.Headers[outbox.HeaderCorrelationID],
		MessageId:     m.ID.String(),
		Timestamp:     m.CreatedAt,
		Type:          m.Type,
		Body:          m.Payload,
	}
}

// ensureChannelLocked makes sure p.ch is an open confirm-mode channel, connecting if needed.
func (p *Publisher) ensureChannelLocked() error {
	if p.ch != nil && !p.ch.IsClosed() && p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	_ = p.resetLocked()
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		Dial:       amqp.DefaultDial(p.cfg.DialTimeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": p.cfg.ConnectionName},
	})
	if err != nil {
		p.setUp(false, err)
		return fmt.Errorf("dial: %w", err)
	}
	ch, err := p.openChannel(conn)
	if err != nil {
		_ = conn.Close()
		p.setUp(false, err)
		return err
	}
	p.conn, p.ch = conn, ch
	p.setUp(true, nil)
	return nil
}

func (p *Publisher) openChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	if p.cfg.Setup != nil {
		if err := p.cfg.Setup(ch); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	// Buffered: the library drops a return it cannot hand over within a few seconds.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1024))
	p.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	return ch, nil
}

func (p *Publisher) resetLocked() error {
	var err error
	if p.conn != nil {
		// A deadline, because a hung broker (a resource alarm, a black-holed network) never
		// answers connection.close, and Close would wait for it with p.mu held.
		err = p.conn.CloseDeadline(time.Now().Add(p.cfg.DialTimeout))
		if errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
		if p.up {
			p.setUp(false, nil)
		}
	}
	p.conn, p.ch, p.returns, p.closed = nil, nil, nil, nil
	return err
}

func (p *Publisher) setUp(up bool, cause error) {
	changed := up != p.up
	p.up = up
	if changed {
		switch {
		case up:
			p.cfg.Logger.Info("rabbitmq publisher connected", "connection_name", p.cfg.ConnectionName)
		case cause == nil:
			p.cfg.Logger.Info("rabbitmq publisher closed its connection", "connection_name", p.cfg.ConnectionName)
		default:
			p.cfg.Logger.Warn("rabbitmq publisher disconnected", "connection_name", p.cfg.ConnectionName, "error", cause)
		}
	}
	if h := p.cfg.Hooks.Connected; h != nil && (changed || !up) {
		h(up)
	}
}

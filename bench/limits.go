package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// publishLimit is limit A: how many persistent ~1 KiB messages per second RabbitMQ confirms
// into a durable queue, with window publishes unconfirmed at once on each of channels
// channels, each on a connection of its own (as each relay has its own). The messages carry
// the properties the outbox publisher sets. batched gives the connections sockets that batch
// their writes (batchedConn, generated from pkg/outbox/outboxrabbitmq), as the outbox publisher's
// do. The CPU of the bench's process and of the broker is sampled around the publishing.
func (e *env) publishLimit(ctx context.Context, top topology, channels, window int, batched bool, d time.Duration) (float64, *CPUUsage, error) {
	chans, closeAll, err := e.confirmChannels("limit-a", channels, batched)
	if err != nil {
		return 0, nil, err
	}
	defer closeAll()
	_, msg := orderEvent(top.Exchange, 0)
	pub := publishing(msg)

	meter := e.startCPU(ctx, "")
	start := time.Now()
	stop := start.Add(d)
	confirmed, err := publishWindowed(ctx, chans, window, func() (string, string, amqp.Publishing, bool) {
		return top.Exchange, msg.RoutingKey, pub, time.Now().Before(stop)
	})
	elapsed := time.Since(start)
	cpu := meter.stop(ctx, int(confirmed))
	if err != nil {
		return 0, nil, err
	}
	return float64(confirmed) / elapsed.Seconds(), cpu, nil
}

// publishing is the AMQP message for msg, with the properties the outbox publisher sets.
func publishing(msg outbox.Message) amqp.Publishing {
	return amqp.Publishing{
		Headers: amqp.Table{
			outbox.HeaderCorrelationID: msg.Headers[outbox.HeaderCorrelationID],
			outbox.HeaderAggregateType: msg.AggregateType,
			outbox.HeaderAggregateID:   msg.AggregateID,
		},
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: msg.Headers[outbox.HeaderCorrelationID],
		MessageId:     msg.ID.String(),
		Timestamp:     time.Now(),
		Type:          msg.Type,
		Body:          msg.Payload,
	}
}

// confirmChannels opens n connections named name-0 … name-(n-1), with amqp091-go's own
// socket or, if batched, the one that batches writes, and a channel in confirm mode on each.
// closeAll closes the connections; it is to be called also when an error is returned.
func (e *env) confirmChannels(name string, n int, batched bool) (chans []*amqp.Channel, closeAll func(), err error) {
	var conns []*amqp.Connection
	closeAll = func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	for i := range n {
		conn, err := e.dialSocket(fmt.Sprintf("%s-%d", name, i), batched)
		if err != nil {
			return nil, closeAll, err
		}
		conns = append(conns, conn)
		ch, err := conn.Channel()
		if err != nil {
			return nil, closeAll, fmt.Errorf("open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			return nil, closeAll, fmt.Errorf("confirm mode: %w", err)
		}
		chans = append(chans, ch)
	}
	return chans, closeAll, nil
}

// publishWindowed publishes, on each channel of chans (in confirm mode) in a goroutine of
// its own, the messages next hands out until it returns false, keeping at most window of
// them unconfirmed per channel, then waits for the confirms still pending. next is called
// from every channel's goroutine at once. It returns how many messages the broker confirmed;
// a nack, a failed publish or the end of ctx is an error.
func publishWindowed(ctx context.Context, chans []*amqp.Channel, window int, next func() (exchange, routingKey string, pub amqp.Publishing, ok bool)) (int64, error) {
	var (
		confirmed atomic.Int64
		wg        sync.WaitGroup
		errs      = make([]error, len(chans))
	)
	for i, ch := range chans {
		wg.Go(func() {
			pending := make([]*amqp.DeferredConfirmation, 0, window)
			wait := func(dc *amqp.DeferredConfirmation) error {
				select {
				case <-dc.Done():
				case <-ctx.Done():
					return ctx.Err()
				}
				if !dc.Acked() {
					return errors.New("nacked")
				}
				confirmed.Add(1)
				return nil
			}
			for ctx.Err() == nil {
				exchange, key, pub, ok := next()
				if !ok {
					break
				}
				if len(pending) == window {
					if err := wait(pending[0]); err != nil {
						errs[i] = err
						return
					}
					pending = pending[1:]
				}
				dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, pub)
				if err != nil {
					errs[i] = fmt.Errorf("publish: %w", err)
					return
				}
				pending = append(pending, dc)
			}
			for _, dc := range pending {
				if err := wait(dc); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return confirmed.Load(), err
	}
	return confirmed.Load(), ctx.Err()
}

// txLimit is limit B: how many order + outbox transactions per second PostgreSQL commits
// with conc writers, each transaction an orders row and one ~1 KiB event through
// outbox.Add.
func (e *env) txLimit(ctx context.Context, dbURL, exchange string, conc int, d time.Duration) (float64, error) {
	pool, err := openPool(ctx, dbURL, int32(conc))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var (
		count atomic.Int64
		wg    sync.WaitGroup
		errs  = make([]error, conc)
		start = time.Now()
		stop  = start.Add(d)
	)
	for i := range conc {
		wg.Go(func() {
			for n := i; time.Now().Before(stop) && ctx.Err() == nil; n += conc {
				if _, _, err := writeOrder(ctx, pool, exchange, n); err != nil {
					errs[i] = err
					return
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(count.Load()) / elapsed.Seconds(), nil
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publishLimit is limit A: how many persistent ~1 KiB messages per second RabbitMQ confirms
// into a durable queue, with window publishes unconfirmed at once on each of channels
// channels, each on a connection of its own (as each relay has its own). The messages carry
// the properties the outbox publisher sets. batched gives the connections sockets that batch
// their writes (batchedConn, generated from pkg/outbox/outboxrabbitmq), as the outbox publisher's
// do. The CPU of the bench's process and of the broker is sampled around the publishing.
func (e *env) publishLimit(ctx context.Context, top topology, channels, window int, batched bool, d time.Duration) (float64, *CPUUsage, error) {
	type worker struct {
		conn *amqp.Connection
		ch   *amqp.Channel
	}
	workers := make([]worker, channels)
	defer func() {
		for _, w := range workers {
			if w.conn != nil {
				_ = w.conn.Close()
			}
		}
	}()
	for i := range workers {
		conn, err := e.dialSocket(fmt.Sprintf("limit-a-%d", i), batched)
		if err != nil {
			return 0, nil, err
		}
		workers[i].conn = conn
		ch, err := conn.Channel()
		if err != nil {
			return 0, nil, fmt.Errorf("open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			return 0, nil, fmt.Errorf("confirm mode: %w", err)
		}
		workers[i].ch = ch
	}
	_, msg := orderEvent(top.Exchange, 0)
	pub := amqp.Publishing{
		Headers:       amqp.Table{"correlation_id": msg.Headers["correlation_id"], "aggregate_type": msg.AggregateType, "aggregate_id": msg.AggregateID},
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: msg.Headers["correlation_id"],
		MessageId:     msg.ID.String(),
		Timestamp:     time.Now(),
		Type:          msg.Type,
		Body:          msg.Payload,
	}

	meter := e.startCPU(ctx, "")
	var (
		confirmed atomic.Int64
		wg        sync.WaitGroup
		errs      = make([]error, channels)
		start     = time.Now()
		stop      = start.Add(d)
	)
	for i, w := range workers {
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
			for time.Now().Before(stop) && ctx.Err() == nil {
				if len(pending) == window {
					if err := wait(pending[0]); err != nil {
						errs[i] = err
						return
					}
					pending = pending[1:]
				}
				dc, err := w.ch.PublishWithDeferredConfirm(top.Exchange, msg.RoutingKey, true, false, pub)
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
	elapsed := time.Since(start)
	cpu := meter.stop(ctx, int(confirmed.Load()))
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}
	return float64(confirmed.Load()) / elapsed.Seconds(), cpu, nil
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

package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// observerQueue is the runner's own queue, bound to the events exchange with "#": it gets a
// copy of every event every relay publishes.
const observerQueue = "chaos.observer"

// Deliveries counts messages per message id: a relay that publishes a message twice (it
// crashed after the broker confirmed it, before it marked the row) shows as two deliveries
// of one id. The zero value is ready to use; it is safe for concurrent use.
type Deliveries struct {
	mu    sync.Mutex
	byID  map[string]int
	byKey map[string]int
	total int
}

// Add counts one delivery.
func (d *Deliveries) Add(messageID, routingKey string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byID == nil {
		d.byID, d.byKey = map[string]int{}, map[string]int{}
	}
	d.byID[messageID]++
	d.byKey[routingKey]++
	d.total++
}

// AddFirst counts a delivery only if messageID was not delivered before.
func (d *Deliveries) AddFirst(messageID, routingKey string) {
	d.mu.Lock()
	seen := d.byID[messageID] > 0
	d.mu.Unlock()
	if !seen {
		d.Add(messageID, routingKey)
	}
}

// DeliveryCounts summarises [Deliveries].
type DeliveryCounts struct {
	// Total counts deliveries, Distinct message ids.
	Total, Distinct int
	// Duplicates is Total - Distinct: deliveries of an id seen before.
	Duplicates int
	// ByRoutingKey counts deliveries per routing key.
	ByRoutingKey map[string]int
	// DuplicateIDs are up to 5 ids delivered more than once, for the report.
	DuplicateIDs []string
}

// Counts returns the counts so far.
func (d *Deliveries) Counts() DeliveryCounts {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := DeliveryCounts{Total: d.total, Distinct: len(d.byID), ByRoutingKey: map[string]int{}}
	c.Duplicates = c.Total - c.Distinct
	for k, n := range d.byKey {
		c.ByRoutingKey[k] = n
	}
	var dup []string
	for id, n := range d.byID {
		if n > 1 {
			dup = append(dup, id)
		}
	}
	slices.Sort(dup)
	if len(dup) > 5 {
		dup = dup[:5]
	}
	c.DuplicateIDs = dup
	return c
}

// observer consumes the observer queue into a Deliveries, reconnecting when the broker goes
// away (the queue is durable, so nothing published meanwhile is missed). It consumes with
// automatic acknowledgement: a delivery is never repeated by the broker, so every duplicate
// it counts was published twice.
//
// On a cluster it is given every node: the queue is then a quorum queue, which outlives the
// node it was declared on, and the observer reconnects to the next node of its list. When
// the queue's leader dies before an automatic acknowledgement is committed, the new leader
// delivers the message again, marked redelivered: such a delivery counts only if its id was
// never seen.
type observer struct {
	urls     []string
	next     int // the index in urls of the next node to dial
	exchange string
	// redelivered counts the deliveries the broker marked as redelivered.
	redelivered atomic.Int64
	counts      Deliveries
	log         *slog.Logger
	cancel      context.CancelFunc
	done        chan struct{}
}

// startObserver declares the exchange (as the services do) and the observer queue, binds
// it, and starts consuming; events published after it returns are all seen.
func startObserver(ctx context.Context, urls []string, exchange string, log *slog.Logger) (*observer, error) {
	if len(urls) == 0 {
		return nil, fmt.Errorf("observer: no broker URL")
	}
	o := &observer{urls: urls, exchange: exchange, log: log, done: make(chan struct{})}
	conn, deliveries, err := o.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("observer: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o.cancel = cancel
	go o.run(runCtx, conn, deliveries)
	return o, nil
}

func (o *observer) connect(ctx context.Context) (*amqp.Connection, <-chan amqp.Delivery, error) {
	url := o.urls[o.next%len(o.urls)]
	o.next++
	conn, err := dialAMQP(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	var args amqp.Table
	if len(o.urls) > 1 {
		args = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(o.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	}
	if err == nil {
		_, err = ch.QueueDeclare(observerQueue, true, false, false, false, args)
	}
	if err == nil {
		err = ch.QueueBind(observerQueue, "#", o.exchange, false, nil)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(observerQueue, "chaos-observer", true, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, deliveries, nil
}

func (o *observer) run(ctx context.Context, conn *amqp.Connection, deliveries <-chan amqp.Delivery) {
	defer close(o.done)
	for {
		o.consume(ctx, deliveries)
		_ = conn.Close()
		if ctx.Err() != nil {
			return
		}
		o.log.Debug("observer lost the broker; reconnecting")
		for {
			if !sleepCtx(ctx, 250*time.Millisecond) {
				return
			}
			var err error
			if conn, deliveries, err = o.connect(ctx); err == nil {
				break
			}
		}
	}
}

func (o *observer) consume(ctx context.Context, deliveries <-chan amqp.Delivery) {
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			id := d.MessageId
			if id == "" {
				id = "(no message id)"
			}
			if d.Redelivered {
				// The broker delivers again what it may have delivered before: on a cluster,
				// a quorum queue whose leader died before the automatic acknowledgement was
				// committed. It counts only if the first delivery never arrived; a message
				// published twice arrives twice as new.
				o.redelivered.Add(1)
				o.counts.AddFirst(id, d.RoutingKey)
				continue
			}
			o.counts.Add(id, d.RoutingKey)
		}
	}
}

// drain waits until the observer queue is empty: every event published so far was counted.
func (o *observer) drain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	empty, i := 0, 0
	return poll(ctx, 100*time.Millisecond, func() (bool, error) {
		url := o.urls[i%len(o.urls)]
		i++ // the next poll asks another node: the one asked may be down
		q, err := inspectQueue(ctx, url, observerQueue)
		if err != nil {
			return false, nil // that node is down, or the queue has no leader yet
		}
		if q.Messages > 0 {
			empty = 0
			return false, nil
		}
		empty++
		return empty >= 2, nil
	})
}

func (o *observer) stop() {
	o.cancel()
	<-o.done
}

// observerURLs are the nodes the observer may use: every node of a cluster, else the one
// broker.
func observerURLs(eps Endpoints) []string {
	if len(eps.AMQPURLs) > 0 {
		return eps.AMQPURLs
	}
	return []string{eps.AMQPURL}
}

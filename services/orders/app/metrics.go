package app

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	inboxmetrics "github.com/outboxshop/outboxshop/pkg/inbox/metrics"
	"github.com/outboxshop/outboxshop/services/orders"
	ordersamqp "github.com/outboxshop/outboxshop/services/orders/amqp"
)

// ServiceName is the value of the service label on every metric of the service's own and of
// the libraries' (docs/metrics.md); the Go and process collectors go without it.
const ServiceName = "orders"

func constLabels() prometheus.Labels { return prometheus.Labels{"service": ServiceName} }

// The relay's backoff between the attempts of a failed row: pkg/outbox's defaults, set
// explicitly so that the redelivery window below is computed from what the relay runs with.
const (
	relayRetryBaseDelay = time.Second
	relayRetryMaxDelay  = 5 * time.Minute
)

// consumedTypes are the message types the stock consumer knows: the type label of the inbox
// metrics; any other type is counted as "other".
var consumedTypes = []string{orders.EventStockReserved, orders.EventStockRejected, orders.EventStockReleased}

// finalStatuses are the statuses orders_outcomes_total counts.
var finalStatuses = []orders.Status{orders.StatusReserved, orders.StatusRejected, orders.StatusCancelled}

// serviceMetrics are the orders service's own metrics (docs/metrics.md, "Services").
type serviceMetrics struct {
	// created counts orders accepted: a POST /orders whose transaction created an order
	// committed (an idempotent replay creates nothing and is not counted).
	created prometheus.Counter
	// outcomes counts the orders reaching a final status, once the consumer's transaction
	// that moved them committed.
	outcomes *prometheus.CounterVec
}

func newServiceMetrics(reg prometheus.Registerer) (*serviceMetrics, error) {
	m := &serviceMetrics{
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orders_created_total", Help: "Orders accepted (201 answers that created an order, not idempotent replays).",
			ConstLabels: constLabels(),
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orders_outcomes_total", Help: "Orders reaching a final status (RESERVED, REJECTED, CANCELLED).",
			ConstLabels: constLabels(),
		}, []string{"status"}),
	}
	for _, c := range []prometheus.Collector{m.created, m.outcomes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, s := range finalStatuses {
		m.outcomes.WithLabelValues(string(s)) // every series from the start, so rate() sees the first
	}
	return m, nil
}

// countingApplier is the store as the stock consumer's handler sees it: every transition to a
// final status is counted once the inbox transaction that made it has committed. It needs
// that transaction to come from an aftercommit.Wrap'ped pool. A duplicate never reaches the
// handler (the inbox skips it), and a transaction that rolls back runs nothing, so no
// transition is counted twice.
type countingApplier struct {
	ordersamqp.StockApplier
	outcomes *prometheus.CounterVec
}

func (c countingApplier) ApplyStockUpdate(ctx context.Context, tx pgx.Tx, u orders.StockUpdate) (orders.StockOutcome, error) {
	out, err := c.StockApplier.ApplyStockUpdate(ctx, tx, u)
	if err == nil && out.Applied && slices.Contains(finalStatuses, out.To) {
		aftercommit.Register(tx, c.outcomes.WithLabelValues(string(out.To)).Inc)
	}
	return out, err
}

// redeliveryWindow is the longest time in which a duplicate of a stock event can still reach
// the stock consumer, exported as inbox_redelivery_window_seconds beside the inbox retention
// (an alert fires when the retention is not longer):
//
//	window = RetryWindow(ORDERS_CONSUMER_MAX_DELIVERIES, ORDERS_CONSUMER_RETRY_DELAY, consumer max retry delay)
//	       + RetryWindow(ORDERS_RELAY_MAX_ATTEMPTS, 1s, 5m)
//
// The first term is the consumer's own retries: MaxDeliveries attempts, backing off
// exponentially from RetryDelay up to the consumer's max retry delay (default 30s, or
// RetryDelay when larger). The second is the producing relay's: a row whose publish failed is
// tried again up to MaxAttempts times, backing off from RetryBaseDelay 1s to RetryMaxDelay 5m,
// and a failed attempt may have reached the broker, so each retry may deliver a duplicate.
// The producer of the stock events is the warehouse's relay, whose settings this process does
// not know: the orders relay's own (same defaults: 10 attempts, 1s to 5m) stand for them.
// RetryWindow sums the waits without their jitter, which only shortens them.
func redeliveryWindow(cfg Config) time.Duration {
	consumer := inboxmetrics.RetryWindow(cfg.ConsumerMaxDeliveries, cfg.ConsumerRetryDelay,
		max(cfg.ConsumerMaxRetryDelay, cfg.ConsumerRetryDelay))
	producer := inboxmetrics.RetryWindow(cfg.RelayMaxAttempts, relayRetryBaseDelay, relayRetryMaxDelay)
	return consumer + producer
}

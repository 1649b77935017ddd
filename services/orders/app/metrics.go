package app

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/services/orders"
	ordersamqp "github.com/outboxshop/outboxshop/services/orders/amqp"
)

// ServiceName is the value of the service label on every metric of the service's own and of
// the libraries' (docs/metrics.md); the Go and process collectors go without it.
const ServiceName = "orders"

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

func newServiceMetrics(p *service.Process) (*serviceMetrics, error) {
	d := service.NewMetrics(p)
	statuses := make([]string, len(finalStatuses))
	for i, s := range finalStatuses {
		statuses[i] = string(s)
	}
	m := &serviceMetrics{
		created: d.Counter("orders_created_total", "Orders accepted (201 answers that created an order, not idempotent replays)."),
		outcomes: d.CounterVec("orders_outcomes_total", "Orders reaching a final status (RESERVED, REJECTED, CANCELLED).",
			"status", statuses...),
	}
	return m, d.Err()
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

package app

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/services/warehouse"
	warehouseamqp "github.com/outboxshop/outboxshop/services/warehouse/amqp"
)

// ServiceName is the value of the service label on every metric of the service's own and of
// the libraries' (docs/metrics.md); the Go and process collectors go without it.
const ServiceName = "warehouse"

// StockMetricsInterval is how often the API process reads the stock for
// warehouse_stock_available.
const StockMetricsInterval = 5 * time.Second

// consumedTypes are the message types the consumer knows: the type label of the inbox
// metrics; any other type is counted as "other".
var consumedTypes = []string{warehouse.TypeOrderCreated, warehouse.TypeOrderCancelled}

// Values of warehouse_reservations_total's result label.
const (
	resultReserved = "reserved"
	resultRejected = "rejected"
)

// serviceMetrics are the warehouse's own metrics (docs/metrics.md, "Services"), in the API
// process, whose consumer makes the decisions.
type serviceMetrics struct {
	reservations *prometheus.CounterVec
	releases     prometheus.Counter
	stock        *prometheus.GaugeVec
}

func newServiceMetrics(p *service.Process) (*serviceMetrics, error) {
	d := service.NewMetrics(p)
	m := &serviceMetrics{
		reservations: d.CounterVec("warehouse_reservations_total", "Reservation decisions for OrderCreated messages: reserved or rejected.",
			"result", resultReserved, resultRejected),
		releases: d.Counter("warehouse_releases_total", "Reservations released (stock given back) by an OrderCancelled."),
		stock:    d.GaugeVec("warehouse_stock_available", "Units on hand of each SKU of the catalogue, read every 5s.", "sku"),
	}
	return m, d.Err()
}

// committed counts a decision of the consumer once the transaction that applied it
// committed (countingApplier).
func (m *serviceMetrics) committed(d warehouse.Decision) {
	switch d.Action {
	case warehouse.ActionReserve:
		m.reservations.WithLabelValues(resultReserved).Inc()
	case warehouse.ActionReject:
		m.reservations.WithLabelValues(resultRejected).Inc()
	case warehouse.ActionRelease:
		m.releases.Inc()
	}
}

// countingApplier is the store as the consumer's handler sees it: every decision that
// changed something (not ActionIgnore) is reported to committed once the inbox transaction
// that applied it has committed. It needs that transaction to come from an
// aftercommit.Wrap'ped pool, as service.AddConsumer's do; with another, committed is
// not called. A duplicate never reaches the handler (the inbox skips it), and a transaction
// that rolls back runs nothing, so no decision is counted twice.
type countingApplier struct {
	warehouseamqp.OrderApplier
	committed func(warehouse.Decision)
}

func (c countingApplier) ApplyOrderCreated(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCreated, meta warehouse.EventMeta) (warehouse.OrderOutcome, error) {
	out, err := c.OrderApplier.ApplyOrderCreated(ctx, tx, ev, meta)
	c.count(tx, out, err)
	return out, err
}

func (c countingApplier) ApplyOrderCancelled(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCancelled, meta warehouse.EventMeta) (warehouse.OrderOutcome, error) {
	out, err := c.OrderApplier.ApplyOrderCancelled(ctx, tx, ev, meta)
	c.count(tx, out, err)
	return out, err
}

func (c countingApplier) count(tx pgx.Tx, out warehouse.OrderOutcome, err error) {
	if err == nil && out.Decision.Action != warehouse.ActionIgnore {
		aftercommit.Register(tx, func() { c.committed(out.Decision) })
	}
}

// stockReader reads the available stock of SKUs. *postgres.Store implements it.
type stockReader interface {
	Available(ctx context.Context, skus []string) (map[string]int64, error)
}

// stockGauge returns the job that sets warehouse_stock_available from the stock table, run
// every StockMetricsInterval (service.Every, which logs a failure streak once and backs off).
// Only the SKUs of the catalogue are exported: PUT /stock/{sku} can create any SKU, and a
// label value per SKU a client invents would be unbounded. A failed read leaves the last
// values.
func (m *serviceMetrics) stockGauge(db stockReader) func(ctx context.Context) error {
	skus := make([]string, len(warehouse.Catalogue))
	for i, c := range warehouse.Catalogue {
		skus[i] = c.SKU
	}
	return func(ctx context.Context) error {
		levels, err := db.Available(ctx, skus)
		if err != nil {
			return err
		}
		for _, sku := range skus {
			if n, ok := levels[sku]; ok {
				m.stock.WithLabelValues(sku).Set(float64(n))
			} else {
				m.stock.DeleteLabelValues(sku) // not in the table (any more)
			}
		}
		return nil
	}
}

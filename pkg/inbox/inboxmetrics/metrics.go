// Package inboxmetrics exposes an inbox's own state as Prometheus metrics, whatever broker
// feeds it: [Window] exports each inbox consumer's retention beside the longest time a
// duplicate can still arrive ([RetryWindow]), so that an alert can fire when a duplicate could
// outlive its inbox row, and [Partitions] how far ahead a partitioned inbox table's
// partitions reach (inbox.Tables.Partition). It imports no broker adapter (the RabbitMQ consumer's metrics are in
// inboxrabbitmq/inboxrabbitmqmetrics) and registers on the [prometheus.Registerer] passed in,
// nothing global; docs/metrics.md of the outboxshop repository lists the metric names.
package inboxmetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Window holds the retention and redelivery window of inbox consumers.
type Window struct {
	retention *prometheus.GaugeVec
	window    *prometheus.GaugeVec
}

// NewWindow registers the window metrics on reg; constLabels (say, service="warehouse") go
// on every one of them.
func NewWindow(reg prometheus.Registerer, constLabels prometheus.Labels) (*Window, error) {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "inbox", Name: name, Help: help, ConstLabels: constLabels},
			[]string{"consumer"})
	}
	w := &Window{
		retention: gauge("retention_seconds", "How long processed message ids are kept."),
		window:    gauge("redelivery_window_seconds", "The longest time in which a duplicate can still arrive."),
	}
	for _, c := range []prometheus.Collector{w.retention, w.window} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Set exports the inbox retention of consumer (the inbox consumer name) and the longest time
// a duplicate can still arrive through it (its own retries plus its producers' relay
// retries). An alert compares them: retention must be longer.
func (w *Window) Set(consumer string, retention, redelivery time.Duration) {
	w.retention.WithLabelValues(consumer).Set(retention.Seconds())
	w.window.WithLabelValues(consumer).Set(redelivery.Seconds())
}

// RetryWindow is the longest a message can spend in n attempts with exponential backoff
// from base, each wait capped at max: the sum of the n-1 waits between them.
func RetryWindow(attempts int, base, max time.Duration) time.Duration {
	var total time.Duration
	d := base
	for i := 1; i < attempts; i++ {
		total += min(d, max)
		if d < max {
			d *= 2
		}
	}
	return total
}

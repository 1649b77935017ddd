// Package outboxrabbitmqmetrics exposes the RabbitMQ publisher's own state as Prometheus metrics:
// whether it has a broker connection, and how often it reconnected. A relay process registers
// them beside package outboxmetrics's, with the same constant labels (README.md#metrics).
package outboxrabbitmqmetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// Publisher holds a RabbitMQ publisher's metrics.
type Publisher struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter

	mu sync.Mutex
	// everConnected holds the publisher's connections (ConnectionChange.Connection) that
	// were up once: their next connect is a reconnect.
	everConnected map[int]bool
	// up holds the connections that are up, as their last change said.
	up map[int]bool
}

// NewPublisher registers the publisher's metrics on reg; constLabels (say,
// service="orders") go on every one of them.
func NewPublisher(reg prometheus.Registerer, constLabels prometheus.Labels) (*Publisher, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "outbox", Name: name, Help: help, ConstLabels: constLabels}
	}
	m := &Publisher{
		connected:  prometheus.NewGauge(prometheus.GaugeOpts(opts("broker_connected", "1 while the publisher has a broker connection."))),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts(opts("broker_reconnects_total", "Successful broker connects after the first."))),

		everConnected: map[int]bool{}, up: map[int]bool{},
	}
	for _, c := range []prometheus.Collector{m.connected, m.reconnects} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Hooks returns h with the metric updates added; h's own callbacks still run.
func (m *Publisher) Hooks(h outboxrabbitmq.Hooks) outboxrabbitmq.Hooks {
	connected := h.Connected
	h.Connected = func(c outboxrabbitmq.ConnectionChange) {
		m.setConnected(c)
		if connected != nil {
			connected(c)
		}
	}
	return h
}

// setConnected follows one of the publisher's connections: the gauge is 1 while any is
// open. It counts the open connections itself, under its lock, rather than trusting the
// order in which concurrent hook calls set the gauge.
func (m *Publisher) setConnected(c outboxrabbitmq.ConnectionChange) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !c.Up {
		delete(m.up, c.Connection)
		m.connected.Set(float64(min(len(m.up), 1)))
		return
	}
	m.up[c.Connection] = true
	m.connected.Set(1)
	if m.everConnected[c.Connection] {
		m.reconnects.Inc()
	}
	m.everConnected[c.Connection] = true
}

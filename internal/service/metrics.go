package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics declares a service's own metrics (docs/metrics.md, "Services"): each on the
// process's registry and with its service label, and a labelled one with the series of its
// known label values created at once, so that rate() sees their first increment. A
// registration that fails is kept for [Metrics.Err]; the metric is returned all the same, so
// that a service declares its metrics in one literal and checks once.
type Metrics struct {
	reg    prometheus.Registerer
	labels prometheus.Labels
	err    error
}

// NewMetrics returns the declarer of p's own metrics.
func NewMetrics(p *Process) *Metrics {
	return &Metrics{reg: p.Registry, labels: p.ConstLabels()}
}

// Counter declares the counter name.
func (m *Metrics) Counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: m.labels})
	m.register(name, c)
	return c
}

// CounterVec declares the counter name with one label, and creates the series of values.
func (m *Metrics) CounterVec(name, help, label string, values ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: m.labels}, []string{label})
	for _, v := range values {
		c.WithLabelValues(v)
	}
	m.register(name, c)
	return c
}

// GaugeVec declares the gauge name with one label, and creates the series of values.
func (m *Metrics) GaugeVec(name, help, label string, values ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: m.labels}, []string{label})
	for _, v := range values {
		g.WithLabelValues(v)
	}
	m.register(name, g)
	return g
}

// Err is the first registration that failed, or nil.
func (m *Metrics) Err() error { return m.err }

func (m *Metrics) register(name string, c prometheus.Collector) {
	if err := m.reg.Register(c); err != nil && m.err == nil {
		m.err = fmt.Errorf("register %s: %w", name, err)
	}
}

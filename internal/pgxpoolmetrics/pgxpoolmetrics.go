// Package pgxpoolmetrics exports a pgxpool.Pool's statistics as Prometheus metrics, read from
// pool.Stat() at scrape time (docs/metrics.md, "Services"):
//
//	pgxpool_total_conns                      gauge    connections open (idle, acquired or being built)
//	pgxpool_idle_conns                       gauge    connections open and not acquired
//	pgxpool_acquired_conns                   gauge    connections in use
//	pgxpool_max_conns                        gauge    the pool's size
//	pgxpool_acquires_total                   counter  successful acquires
//	pgxpool_empty_acquires_total             counter  acquires that found no idle connection and waited
//	pgxpool_acquire_duration_seconds_total   counter  time spent in successful acquires
//
// Register it on the service's own registry, with the service label:
//
//	reg.MustRegister(pgxpoolmetrics.New(pool, prometheus.Labels{"service": "orders"}))
package pgxpoolmetrics

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Stater is what the collector reads. *pgxpool.Pool implements it.
type Stater interface {
	Stat() *pgxpool.Stat
}

var _ Stater = (*pgxpool.Pool)(nil)

// Collector is a prometheus.Collector of a pool's statistics. Reading them costs a lock of
// the pool, no query.
type Collector struct {
	pool Stater

	totalConns      *prometheus.Desc
	idleConns       *prometheus.Desc
	acquiredConns   *prometheus.Desc
	maxConns        *prometheus.Desc
	acquires        *prometheus.Desc
	emptyAcquires   *prometheus.Desc
	acquireDuration *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a collector of pool's statistics; constLabels (say, service="orders") go on
// every metric.
func New(pool Stater, constLabels prometheus.Labels) *Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("pgxpool", "", name), help, nil, constLabels)
	}
	return &Collector{
		pool:            pool,
		totalConns:      desc("total_conns", "Connections open in the pool: idle, acquired or being built."),
		idleConns:       desc("idle_conns", "Connections open in the pool and not acquired."),
		acquiredConns:   desc("acquired_conns", "Connections acquired from the pool (in use)."),
		maxConns:        desc("max_conns", "The largest number of connections the pool opens."),
		acquires:        desc("acquires_total", "Successful acquires of a connection from the pool."),
		emptyAcquires:   desc("empty_acquires_total", "Successful acquires that found no idle connection and waited for one."),
		acquireDuration: desc("acquire_duration_seconds_total", "Total time spent in successful acquires."),
	}
}

// Describe sends the descriptors of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.totalConns, c.idleConns, c.acquiredConns, c.maxConns,
		c.acquires, c.emptyAcquires, c.acquireDuration} {
		ch <- d
	}
}

// Collect reads the pool's statistics once and sends every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.totalConns, prometheus.GaugeValue, float64(s.TotalConns()))
	ch <- prometheus.MustNewConstMetric(c.idleConns, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.acquiredConns, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.acquireDuration, prometheus.CounterValue, s.AcquireDuration().Seconds())
}

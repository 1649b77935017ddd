// Package inboxrabbitmqmetrics exposes a RabbitMQ inbox consumer's work as Prometheus metrics:
// [Consumer] turns the consumer's [inboxrabbitmq.Hooks] into counters, gauges and a histogram
// labelled by consumer name and message type, registered on the [prometheus.Registerer]
// passed in (nothing is global). A consumer process registers package inboxmetrics beside it,
// with the same constant labels. docs/metrics.md of the outboxshop repository lists the names.
//
// inbox_handler_duration_seconds carries exemplars: a delivery handled under a sampled process
// span ([inboxrabbitmq.ProcessedMessage].SpanContext) records its trace and span ids with its
// observation. Prometheus only sees them when /metrics is served as OpenMetrics
// (promhttp.HandlerOpts.EnableOpenMetrics).
package inboxrabbitmqmetrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// OtherType is the type label of messages whose type is not in Config.KnownTypes: a producer
// cannot blow up the number of series by inventing types.
const OtherType = "other"

// Config configures [NewConsumer].
type Config struct {
	// KnownTypes are the message types that get a label value of their own.
	KnownTypes []string
	// ConstLabels go on every metric (say, service="warehouse").
	ConstLabels prometheus.Labels
}

// Consumer holds an inbox consumer's metrics.
type Consumer struct {
	known      []string
	processed  *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	errors     *prometheus.CounterVec
	transient  *prometheus.CounterVec
	retries    *prometheus.CounterVec
	dead       *prometheus.CounterVec
	handedBack *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	connected  *prometheus.GaugeVec
	held       *prometheus.GaugeVec
	shortfall  *prometheus.GaugeVec
}

// NewConsumer registers the consumer metrics on reg.
func NewConsumer(reg prometheus.Registerer, cfg Config) (*Consumer, error) {
	labels := []string{"consumer", "type"}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "inbox", Name: name, Help: help, ConstLabels: cfg.ConstLabels},
			append(slices.Clone(labels), extra...))
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "inbox", Name: name, Help: help, ConstLabels: cfg.ConstLabels},
			[]string{"consumer"})
	}
	m := &Consumer{
		known:      slices.Clone(cfg.KnownTypes),
		processed:  counter("messages_processed_total", "Messages applied and committed."),
		duplicates: counter("duplicates_total", "Deliveries skipped because the message was already processed."),
		errors:     counter("handler_errors_total", "Failed attempts: handler or database errors, transient ones included."),
		transient:  counter("transient_errors_total", "Failed attempts retried in place without counting: the database unreachable, a deadlock, an error marked transient."),
		retries:    counter("retries_total", "Messages sent back for another attempt."),
		dead:       counter("dead_lettered_total", "Messages sent to the dead-letter queue.", "reason"),
		handedBack: counter("handed_back_total", "Deliveries given back to the broker unprocessed.", "reason"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "inbox", Name: "handler_duration_seconds", ConstLabels: cfg.ConstLabels,
			Help:    "Time from receipt to acknowledgement of a processed or duplicate message.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, labels),
		connected: gauge("broker_connected", "1 while the consumer is consuming."),
		held:      gauge("held_messages", "Deliveries held for an in-place retry after transient failures."),
		shortfall: gauge("pool_shortfall_connections",
			"Connections the consumer's handlers may hold at once beyond its pool's size; 0 when the pool is large enough or its size is unknown."),
	}
	for _, c := range []prometheus.Collector{m.processed, m.duplicates, m.errors, m.transient, m.retries, m.dead,
		m.handedBack, m.duration, m.connected, m.held, m.shortfall} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Init creates the series of a consumer at zero, so that rate() and absent() work before
// the first message, and increase() sees the first dead letter of every reason.
func (m *Consumer) Init(consumer string) {
	for _, t := range append(slices.Clone(m.known), OtherType) {
		m.processed.WithLabelValues(consumer, t)
		m.duplicates.WithLabelValues(consumer, t)
		m.errors.WithLabelValues(consumer, t)
		m.transient.WithLabelValues(consumer, t)
		m.retries.WithLabelValues(consumer, t)
		for _, reason := range inboxrabbitmq.Reasons() {
			m.dead.WithLabelValues(consumer, t, reason)
		}
		for _, reason := range []string{inboxrabbitmq.HandBackHoldLimit, inboxrabbitmq.HandBackShutdown, inboxrabbitmq.HandBackRequeued} {
			m.handedBack.WithLabelValues(consumer, t, reason)
		}
	}
	m.connected.WithLabelValues(consumer)
	m.held.WithLabelValues(consumer)
	m.shortfall.WithLabelValues(consumer)
}

// SetPoolSize exports the shortfall of s, the [inboxrabbitmq.Consumer.PoolSize] of consumer (the
// inbox consumer name), as inbox_pool_shortfall_connections.
func (m *Consumer) SetPoolSize(consumer string, s inboxrabbitmq.PoolSize) {
	m.shortfall.WithLabelValues(consumer).Set(float64(s.Shortfall()))
}

// Exemplar labels: the trace and span of an observation made under a sampled span.
const (
	ExemplarTraceID = "trace_id"
	ExemplarSpanID  = "span_id"
)

// observe records v on h, with the trace and span ids of sc as its exemplar when sc is
// sampled. Without a sampled span it is a plain Observe: nothing allocated.
func observe(h prometheus.Observer, v float64, sc trace.SpanContext) {
	if sc.IsSampled() {
		if eo, ok := h.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{
				ExemplarTraceID: sc.TraceID().String(), ExemplarSpanID: sc.SpanID().String(),
			})
			return
		}
	}
	h.Observe(v)
}

func (m *Consumer) typ(t string) string {
	if slices.Contains(m.known, t) {
		return t
	}
	return OtherType
}

// Hooks returns h with the metric updates added; h's own callbacks still run.
func (m *Consumer) Hooks(h inboxrabbitmq.Hooks) inboxrabbitmq.Hooks {
	processed, handlerErr, retried, dead, connected := h.Processed, h.HandlerError, h.Retried, h.DeadLettered, h.Connected
	held, handedBack := h.Held, h.HandedBack
	h.Processed = func(e inboxrabbitmq.ProcessedMessage) {
		t := m.typ(e.Type)
		if e.Duplicate {
			m.duplicates.WithLabelValues(e.Consumer, t).Inc()
		} else {
			m.processed.WithLabelValues(e.Consumer, t).Inc()
		}
		observe(m.duration.WithLabelValues(e.Consumer, t), e.Duration.Seconds(), e.SpanContext)
		if processed != nil {
			processed(e)
		}
	}
	h.HandlerError = func(e inboxrabbitmq.HandlerFailure) {
		m.errors.WithLabelValues(e.Consumer, m.typ(e.Type)).Inc()
		if inbox.IsTransient(e.Err) {
			m.transient.WithLabelValues(e.Consumer, m.typ(e.Type)).Inc()
		}
		if handlerErr != nil {
			handlerErr(e)
		}
	}
	h.Retried = func(e inboxrabbitmq.Retry) {
		m.retries.WithLabelValues(e.Consumer, m.typ(e.Type)).Inc()
		if retried != nil {
			retried(e)
		}
	}
	h.DeadLettered = func(e inboxrabbitmq.DeadLetter) {
		m.dead.WithLabelValues(e.Consumer, m.typ(e.Type), e.Reason).Inc()
		if dead != nil {
			dead(e)
		}
	}
	h.Held = func(e inboxrabbitmq.Hold) {
		if e.Held {
			m.held.WithLabelValues(e.Consumer).Inc()
		} else {
			m.held.WithLabelValues(e.Consumer).Dec()
		}
		if held != nil {
			held(e)
		}
	}
	h.HandedBack = func(e inboxrabbitmq.HandBack) {
		m.handedBack.WithLabelValues(e.Consumer, m.typ(e.Type), e.Reason).Inc()
		if handedBack != nil {
			handedBack(e)
		}
	}
	h.Connected = func(e inboxrabbitmq.ConnectionChange) {
		v := 0.0
		if e.Up {
			v = 1
		}
		m.connected.WithLabelValues(e.Consumer).Set(v)
		if connected != nil {
			connected(e)
		}
	}
	return h
}

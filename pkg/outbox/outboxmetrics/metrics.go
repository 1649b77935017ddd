// Package outboxmetrics exposes a relay's and an outbox table's state as Prometheus metrics,
// whatever the broker (README.md#metrics): [Relay] in the relay process, from its
// [outbox.Hooks]; [Stats] in a process that is not the relay, from [outbox.ReadStats].
// Everything is registered on the [prometheus.Registerer] passed in; nothing is global.
//
// outbox_commit_to_confirm_seconds carries the trace_id and span_id of a row's sampled
// publish span ([outbox.BatchResult].PublishedSpans) as exemplars, which Prometheus sees only
// when /metrics is served as OpenMetrics (promhttp.HandlerOpts.EnableOpenMetrics).
package outboxmetrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
)

// Publish error reasons, the values of the reason label.
const (
	ReasonUnroutable  = "unroutable"
	ReasonNacked      = "nacked"
	ReasonTooLarge    = "too_large"
	ReasonPermanent   = "permanent"
	ReasonUnavailable = "unavailable"
	ReasonOther       = "other"
)

var states = []outbox.State{outbox.StateStarting, outbox.StateRunning, outbox.StateBrokerUnavailable,
	outbox.StateDatabaseUnavailable, outbox.StateStopped, outbox.StateStandby}

// Relay holds a relay's metrics.
type Relay struct {
	published     prometheus.Counter
	errors        *prometheus.CounterVec
	retries       prometheus.Counter
	dead          prometheus.Counter
	latency       prometheus.Histogram
	batchSize     prometheus.Histogram
	lastPoll      prometheus.Gauge
	lastPublish   prometheus.Gauge
	state         *prometheus.GaugeVec
	poolShortfall prometheus.Gauge
	catchups      *prometheus.CounterVec
	catchupRows   prometheus.Counter

	stateMu sync.Mutex // hooks may run concurrently: one state's gauges are set at a time

	behindMu sync.Mutex
	oldest   time.Time // a WAL relay's oldest transaction streamed and not settled
	now      func() time.Time
}

// NewRelay registers a relay's metrics on reg; constLabels (say, service="orders") go on
// every one of them.
func NewRelay(reg prometheus.Registerer, constLabels prometheus.Labels) (*Relay, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "outbox", Name: name, Help: help, ConstLabels: constLabels}
	}
	m := &Relay{
		published: prometheus.NewCounter(prometheus.CounterOpts(opts("published_total", "Rows confirmed by the broker and marked published (or deleted: DeletePublished)."))),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts(opts("publish_errors_total",
			"Failed publish attempts by reason; unavailable counts rows left untouched by a broker outage.")), []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts(opts("retries_total", "Failed rows scheduled for another attempt."))),
		dead:    prometheus.NewCounter(prometheus.CounterOpts(opts("dead_total", "Rows this relay marked dead."))),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "outbox", Name: "commit_to_confirm_seconds", ConstLabels: constLabels,
			Help:    "Time from a row's creation (the start of its transaction) to its broker confirm.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "outbox", Name: "batch_size", ConstLabels: constLabels,
			Help:    "Rows claimed by a non-empty relay cycle.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000},
		}),
		lastPoll: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_poll_timestamp_seconds",
			"Unix time of the last successful claim, idle or not."))),
		lastPublish: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_publish_timestamp_seconds",
			"Unix time of the last published batch."))),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("relay_state",
			"1 for the relay's current state, 0 for the others.")), []string{"state"}),
		poolShortfall: prometheus.NewGauge(prometheus.GaugeOpts(opts("pool_shortfall_connections",
			"Connections the relay may hold at once beyond its pool's size; 0 when the pool is large enough or its size is unknown."))),
		catchups: prometheus.NewCounterVec(prometheus.CounterOpts(opts("wal_catchups_total",
			"Slots a WAL relay created, by reason: each handed the rows pending then to its retry lane.")), []string{"reason"}),
		catchupRows: prometheus.NewCounter(prometheus.CounterOpts(opts("wal_catchup_rows_total",
			"Rows pending at a slot's creation that a WAL relay handed to its retry lane."))),
		now: time.Now,
	}
	behind := prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("wal_behind_seconds",
		"Age of the oldest transaction a WAL relay streamed and has not settled (its slot's position stays before it); 0 when there is none, and on a polling relay.")),
		m.behind)
	for _, c := range []prometheus.Collector{m.published, m.errors, m.retries, m.dead, m.latency, m.batchSize,
		m.lastPoll, m.lastPublish, m.state, m.poolShortfall, m.catchups, m.catchupRows, behind} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{ReasonUnroutable, ReasonNacked, ReasonTooLarge, ReasonPermanent, ReasonUnavailable, ReasonOther} {
		m.errors.WithLabelValues(r) // every series exists from the start, so rate() sees the first error
	}
	for _, r := range []outbox.SlotReason{outbox.SlotNew, outbox.SlotGone, outbox.SlotInvalidated, outbox.SlotUnfinished} {
		m.catchups.WithLabelValues(string(r))
	}
	m.setState(outbox.StateStarting)
	return m, nil
}

// Hooks returns h with the metric updates added; h's own callbacks (a Failpoint, say) still run.
func (m *Relay) Hooks(h outbox.Hooks) outbox.Hooks {
	polled, done, changed := h.Polled, h.BatchDone, h.StateChanged
	h.Polled = func(p outbox.Poll) {
		m.lastPoll.SetToCurrentTime()
		if p.Claimed > 0 {
			m.batchSize.Observe(float64(p.Claimed))
		}
		if polled != nil {
			polled(p)
		}
	}
	h.BatchDone = func(b outbox.BatchResult) {
		m.observe(b)
		if done != nil {
			done(b)
		}
	}
	h.StateChanged = func(c outbox.StateChange) {
		m.setState(c.To)
		if changed != nil {
			changed(c)
		}
	}
	progress, created := h.WALProgress, h.SlotCreated
	h.WALProgress = func(p outbox.WALProgress) {
		m.behindMu.Lock()
		m.oldest = p.Oldest
		m.behindMu.Unlock()
		if progress != nil {
			progress(p)
		}
	}
	h.SlotCreated = func(c outbox.SlotCreated) {
		m.catchups.WithLabelValues(string(c.Reason)).Inc()
		m.catchupRows.Add(float64(c.Handed))
		if created != nil {
			created(c)
		}
	}
	return h
}

// behind is outbox_wal_behind_seconds: the age of the oldest transaction streamed and not
// settled, at the scrape. It goes on growing while the relay is stuck, and never below 0
// (the server's clock may be ahead of this one's).
func (m *Relay) behind() float64 {
	m.behindMu.Lock()
	defer m.behindMu.Unlock()
	if m.oldest.IsZero() {
		return 0
	}
	return max(0, m.now().Sub(m.oldest).Seconds())
}

// SetPoolSize exports s, the relay's [outbox.Relay.PoolSize] (README.md#sizing-the-pool).
func (m *Relay) SetPoolSize(s outbox.PoolSize) { m.poolShortfall.Set(float64(s.Shortfall())) }

func (m *Relay) observe(b outbox.BatchResult) {
	if n := len(b.Published); n > 0 {
		m.published.Add(float64(n))
		m.lastPublish.Set(float64(b.ConfirmedAt.UnixNano()) / 1e9)
		for i, msg := range b.Published {
			v := b.ConfirmedAt.Sub(msg.CreatedAt).Seconds()
			if i < len(b.PublishedSpans) {
				observe(m.latency, v, b.PublishedSpans[i])
			} else {
				m.latency.Observe(v)
			}
		}
	}
	for _, f := range b.Failed {
		m.errors.WithLabelValues(Reason(f.Err)).Inc()
		if f.Dead {
			m.dead.Inc()
		} else {
			m.retries.Inc()
		}
	}
	if b.Untouched > 0 {
		m.errors.WithLabelValues(ReasonUnavailable).Add(float64(b.Untouched))
	}
	if b.Deferred > 0 { // refused by the broker (nacks): retried later, no attempt counted
		m.errors.WithLabelValues(ReasonNacked).Add(float64(b.Deferred))
	}
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

func (m *Relay) setState(s outbox.State) {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	for _, st := range states {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(string(st)).Set(v)
	}
}

// Reason classifies a publish error for the reason label, by the broker-neutral errors of
// package outbox: [outbox.ErrUnroutable] is unroutable, [outbox.ErrRefused] (a RabbitMQ nack)
// is nacked.
func Reason(err error) string {
	switch {
	case errors.Is(err, outbox.ErrUnroutable):
		return ReasonUnroutable
	case errors.Is(err, outbox.ErrRefused):
		return ReasonNacked
	case errors.Is(err, outbox.ErrTooLarge):
		return ReasonTooLarge
	case errors.Is(err, outbox.ErrUnavailable), errors.Is(err, outbox.ErrNotSent):
		return ReasonUnavailable
	case outbox.IsPermanent(err):
		return ReasonPermanent
	default:
		return ReasonOther
	}
}

// Stats polls the outbox table's state: at an interval, not on scrape, so that the query's
// cost is fixed however often Prometheus scrapes.
type Stats struct {
	db          outbox.DBTX
	store       *outbox.Store
	slot        string
	interval    time.Duration
	log         *slog.Logger
	pending     prometheus.Gauge
	oldestAge   prometheus.Gauge
	dead        prometheus.Gauge
	lastSuccess prometheus.Gauge
	// partitionsAhead is nil for a plain table.
	partitionsAhead prometheus.Gauge
	// The WAL relay's slot (outbox.SlotStats).
	slotExists, slotActive, slotLost, slotLag, slotRetained, slotSafe prometheus.Gauge
}

// DefaultStatsInterval is the default of [StatsConfig].Interval.
const DefaultStatsInterval = 5 * time.Second

// StatsConfig tunes [Stats].
type StatsConfig struct {
	// Tables names the outbox table to read. Default: the default outbox.Tables.
	Tables outbox.Tables
	// Interval between reads. Default 5s ([DefaultStatsInterval]).
	Interval time.Duration
	// ConstLabels go on every metric.
	ConstLabels prometheus.Labels
	// Logger receives the lines of a streak of failed reads. nil discards.
	Logger *slog.Logger
	// Slot names the replication slot of a WAL relay of the table, whose state the
	// outbox_wal_slot_* metrics show (outbox.SlotStats). Default: Tables.WALName(), the WAL
	// relay's default. A table without a WAL relay has no slot: outbox_wal_slot_exists 0.
	Slot string
}

// WithDefaults returns c with every default filled in, as [NewStats] runs with it, or an
// error for an invalid field.
func (c StatsConfig) WithDefaults() (StatsConfig, error) {
	if c.Interval < 0 {
		return c, fmt.Errorf("outboxmetrics: stats interval must be >= 0 (0 means %s), got %s", DefaultStatsInterval, c.Interval)
	}
	if err := c.Tables.Validate(); err != nil {
		return c, err // outbox.ErrInvalidTables
	}
	c.Tables = c.Tables.WithDefaults()
	c.Slot = cmp.Or(c.Slot, c.Tables.WALName())
	c.Interval = cmp.Or(c.Interval, DefaultStatsInterval)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c, nil
}

// NewStats registers the table metrics on reg. Call [Stats.Run] to keep them fresh.
func NewStats(reg prometheus.Registerer, db outbox.DBTX, cfg StatsConfig) (*Stats, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	store, err := outbox.NewStore(cfg.Tables)
	if err != nil {
		return nil, err
	}
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "outbox", Name: name, Help: help, ConstLabels: cfg.ConstLabels}
	}
	s := &Stats{
		db: db, store: store, slot: cfg.Slot, interval: cfg.Interval, log: cfg.Logger,
		pending:      prometheus.NewGauge(opts("pending_messages", "Outbox rows not yet published and not dead (the backlog).")),
		oldestAge:    prometheus.NewGauge(opts("oldest_pending_age_seconds", "Age of the oldest pending outbox row; 0 when none.")),
		dead:         prometheus.NewGauge(opts("dead_messages", "Outbox rows that gave up.")),
		lastSuccess:  prometheus.NewGauge(opts("stats_last_success_timestamp_seconds", "Unix time the outbox table was last read.")),
		slotExists:   prometheus.NewGauge(opts("wal_slot_exists", "1 when the WAL relay's replication slot exists.")),
		slotActive:   prometheus.NewGauge(opts("wal_slot_active", "1 when a WAL relay streams the slot now.")),
		slotLost:     prometheus.NewGauge(opts("wal_slot_lost", "1 when the server invalidated the slot (max_slot_wal_keep_size); the relay creates it again.")),
		slotLag:      prometheus.NewGauge(opts("wal_slot_lag_bytes", "WAL written since the slot's confirmed position: what the WAL relay has not confirmed.")),
		slotRetained: prometheus.NewGauge(opts("wal_slot_retained_bytes", "WAL the server keeps for the slot.")),
		slotSafe: prometheus.NewGauge(opts("wal_slot_safe_bytes",
			"WAL that may still be written before the server invalidates the slot (safe_wal_size); +Inf without max_slot_wal_keep_size.")),
	}
	cs := []prometheus.Collector{s.pending, s.oldestAge, s.dead, s.lastSuccess,
		s.slotExists, s.slotActive, s.slotLost, s.slotLag, s.slotRetained, s.slotSafe}
	if cfg.Tables.Partition != 0 {
		s.partitionsAhead = prometheus.NewGauge(opts("partitions_ahead_seconds",
			"How far ahead of now the partitioned outbox table's partitions reach (outbox.Stats.PartitionsEnd); writers fail past it. Negative when behind."))
		cs = append(cs, s.partitionsAhead)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Refresh reads the table, and the WAL relay's slot, once.
func (s *Stats) Refresh(ctx context.Context) error {
	st, err := s.store.ReadStats(ctx, s.db)
	if err != nil {
		return err
	}
	s.pending.Set(float64(st.Pending))
	s.dead.Set(float64(st.Dead))
	age := 0.0
	if !st.OldestPending.IsZero() {
		age = max(0, time.Since(st.OldestPending).Seconds())
	}
	s.oldestAge.Set(age)
	if s.partitionsAhead != nil {
		ahead := math.Inf(-1) // no partition at all: every write fails
		if !st.PartitionsEnd.IsZero() {
			ahead = time.Until(st.PartitionsEnd).Seconds()
		}
		s.partitionsAhead.Set(ahead)
	}
	slot, err := s.store.ReadSlotStats(ctx, s.db, s.slot)
	if err != nil {
		return err
	}
	s.slotExists.Set(b2f(slot.Exists))
	s.slotActive.Set(b2f(slot.Active))
	s.slotLost.Set(b2f(slot.Lost))
	s.slotLag.Set(float64(slot.LagBytes))
	s.slotRetained.Set(float64(slot.RetainedBytes))
	safe := float64(slot.SafeBytes)
	if slot.SafeBytes < 0 || !slot.Exists {
		safe = math.Inf(1)
	}
	s.slotSafe.Set(safe)
	s.lastSuccess.SetToCurrentTime()
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Run refreshes the metrics every interval until ctx is cancelled, then returns nil. A failed
// read leaves the last values (the last-success timestamp shows their age) and is retried
// with the relay's default outage backoff ([outbox.Config].OutageBaseDelay), never later
// than the interval, and logged once per failure streak (README.md#operations).
func (s *Stats) Run(ctx context.Context) error {
	failures := &retry.Streak{What: "outbox stats", Logger: s.log,
		Backoff: retry.Backoff{Base: outbox.DefaultOutageBaseDelay, Max: outbox.DefaultOutageMaxDelay}}
	for {
		start := time.Now()
		err := s.Refresh(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			wait = min(failures.Fail(ctx, err), s.interval)
		default:
			failures.Succeed(ctx)
			wait = s.interval - time.Since(start)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

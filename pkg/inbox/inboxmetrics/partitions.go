package inboxmetrics

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

// DefaultPartitionsInterval is the default of [PartitionsConfig].Interval.
const DefaultPartitionsInterval = 30 * time.Second

// PartitionsConfig tunes [Partitions].
type PartitionsConfig struct {
	// Tables names the partitioned inbox table to watch; its Partition must be set.
	Tables inbox.Tables
	// Interval between reads. Default 30s ([DefaultPartitionsInterval]).
	Interval time.Duration
	// ConstLabels go on every metric.
	ConstLabels prometheus.Labels
	// Logger receives the lines of a streak of failed reads. nil discards.
	Logger *slog.Logger
}

// Partitions polls how far ahead of now a partitioned inbox table's partitions reach
// (inbox.Store.PartitionsEnd), as inbox_partitions_ahead_seconds: at an interval, not on
// scrape, so that the read's cost is fixed however often Prometheus scrapes. The
// InboxPartitionsRunningOut alert fires on it.
type Partitions struct {
	db          inbox.Execer
	store       *inbox.Store
	interval    time.Duration
	log         *slog.Logger
	ahead       prometheus.Gauge
	lastSuccess prometheus.Gauge
}

// NewPartitions registers the partition metrics of cfg.Tables on reg. Call [Partitions.Run]
// to keep them fresh.
func NewPartitions(reg prometheus.Registerer, db inbox.Execer, cfg PartitionsConfig) (*Partitions, error) {
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("inboxmetrics: partitions interval must be >= 0 (0 means %s), got %s", DefaultPartitionsInterval, cfg.Interval)
	}
	if cfg.Tables.Partition == 0 {
		return nil, fmt.Errorf("inboxmetrics: %s is not partitioned: set Tables.Partition", cfg.Tables)
	}
	store, err := inbox.NewStore(cfg.Tables)
	if err != nil {
		return nil, err // inbox.ErrInvalidTables
	}
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "inbox", Name: name, Help: help, ConstLabels: cfg.ConstLabels}
	}
	p := &Partitions{
		db: db, store: store, interval: cmp.Or(cfg.Interval, DefaultPartitionsInterval),
		log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		ahead: prometheus.NewGauge(opts("partitions_ahead_seconds",
			"How far ahead of now the partitioned inbox table's partitions reach (inbox.Store.PartitionsEnd); messages fail past it. Negative when behind.")),
		lastSuccess: prometheus.NewGauge(opts("partitions_last_success_timestamp_seconds",
			"Unix time the inbox table's partitions were last read.")),
	}
	for _, c := range []prometheus.Collector{p.ahead, p.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Refresh reads the partitions once.
func (p *Partitions) Refresh(ctx context.Context) error {
	end, err := p.store.PartitionsEnd(ctx, p.db)
	if err != nil {
		return err
	}
	ahead := math.Inf(-1) // no partition at all: every message fails
	if !end.IsZero() {
		ahead = time.Until(end).Seconds()
	}
	p.ahead.Set(ahead)
	p.lastSuccess.SetToCurrentTime()
	return nil
}

// Run refreshes the metrics every interval until ctx is cancelled, then returns nil. A failed
// read leaves the last values (the last-success timestamp shows their age) and is retried
// with the inbox's outage backoff ([inbox.DefaultOutageBaseDelay]), never later than the
// interval, and logged once per failure streak.
func (p *Partitions) Run(ctx context.Context) error {
	failures := &retry.Streak{What: "inbox partitions", Logger: p.log,
		Backoff: retry.Backoff{Base: inbox.DefaultOutageBaseDelay, Max: inbox.DefaultOutageMaxDelay}}
	for {
		start := time.Now()
		err := p.Refresh(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			wait = min(failures.Fail(ctx, err), p.interval)
		default:
			failures.Succeed(ctx)
			wait = p.interval - time.Since(start)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

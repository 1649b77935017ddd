package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
)

// Names of the crash points of a relay cycle, passed to [Hooks].Failpoint.
const (
	// FailpointBeforePublish: rows claimed (locked in the open transaction), nothing sent.
	FailpointBeforePublish = "relay.before-publish"
	// FailpointAfterPublish: the broker confirmed the batch; no row is marked yet.
	FailpointAfterPublish = "relay.after-publish"
	// FailpointAfterMark: rows marked published; the transaction is not committed yet.
	FailpointAfterMark = "relay.after-mark"
	// FailpointAfterCommit, in a [WALRelay]'s stream only: the batch's marks are committed;
	// the slot's position does not count the batch yet.
	FailpointAfterCommit = "relay.after-commit"
	// FailpointLaneAfterPublish is FailpointAfterPublish in a [WALRelay]'s retry lane (a
	// catch-up after a lost slot, say), which passes its other points as a polling relay
	// does.
	FailpointLaneAfterPublish = "relay.lane.after-publish"
)

// NotifyChannel is the PostgreSQL channel the trigger of the default [Tables] notifies on
// commit; [Tables.NotifyChannel] gives any outbox's.
const NotifyChannel = "outbox_messages"

// NotifyChannel returns the PostgreSQL channel the trigger on t's table notifies and its
// relays listen on: the table's name, prefixed by "schema." when Schema is set, shortened
// with a hash of the schema past PostgreSQL's 63 bytes.
func (t Tables) NotifyChannel() string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return t.Messages
	}
	if c := t.Schema + "." + t.Messages; len(c) <= 63 {
		return c
	}
	h := fnv.New32a()
	h.Write([]byte(t.Schema))
	return fmt.Sprintf("%s.%08x", t.Messages, h.Sum32())
}

// State is what a relay is doing, as shown in logs, [Relay.State] and [Hooks].StateChanged.
type State string

// The states of a relay. The two unavailable states are its circuit breaker: while in one, the
// relay does not count attempts against rows; it waits with backoff and probes again.
const (
	StateStarting            State = "starting"
	StateRunning             State = "running"
	StateBrokerUnavailable   State = "broker_unavailable"
	StateDatabaseUnavailable State = "database_unavailable"
	StateStopped             State = "stopped"
	// StateStandby is a [WALRelay]'s while another process streams its slot: it is ready to
	// take over, and tries every [Config].PollInterval.
	StateStandby State = "standby"
)

// Defaults and limits of [Config]: each field says what they mean.
const (
	DefaultBatchSize          = 100
	DefaultPollInterval       = time.Second
	DefaultNotifyRecheck      = 3 * time.Millisecond
	DefaultMaxAttempts        = 10
	DefaultRetryBaseDelay     = time.Second
	DefaultRetryMaxDelay      = 5 * time.Minute
	DefaultOutageBaseDelay    = 100 * time.Millisecond
	DefaultOutageMaxDelay     = 10 * time.Second
	DefaultPublishTimeout     = 30 * time.Second
	DefaultClaimTimeoutMargin = 5 * time.Second
	DefaultMaxMessageBytes    = 16 << 20
	DefaultInFlightBatches    = 2
	MaxInFlightBatches        = 16
)

// Config tunes a [Relay]. The zero value of every field means its default;
// [Config.WithDefaults] returns what the relay will use.
type Config struct {
	// Tables names the outbox table, and so its notify channel; invalid names are refused.
	Tables Tables
	// BatchSize is the most rows one cycle claims and publishes, at most 10000. Default 100
	// ([DefaultBatchSize]).
	BatchSize int
	// PollInterval is how often the relay looks for due rows when no notification woke it,
	// and so the clock for retries. Default 1s ([DefaultPollInterval]).
	PollInterval time.Duration
	// DisableNotify turns off LISTEN/NOTIFY wake-ups; the relay then only polls.
	DisableNotify bool
	// NotifyRecheck is how long after a cycle that a notification started, or that found
	// rows, the relay looks again, for rows whose writers did not notify
	// (README.md#wake-ups); an empty re-check doubles it until it reaches PollInterval.
	// Default 3ms ([DefaultNotifyRecheck]); at PollInterval or above, no re-checks.
	NotifyRecheck time.Duration
	// MaxAttempts is how many failed publish attempts make a row dead. Default 10
	// ([DefaultMaxAttempts]).
	MaxAttempts int
	// RetryBaseDelay and RetryMaxDelay bound the backoff between the attempts of one row,
	// and between the broker's refusals of it ([ErrRefused]): exponential, capped, with
	// jitter. Defaults 1s and 5m ([DefaultRetryBaseDelay], [DefaultRetryMaxDelay]).
	RetryBaseDelay, RetryMaxDelay time.Duration
	// OutageBaseDelay and OutageMaxDelay bound the backoff while the broker or the database
	// is unavailable to the relay, or the broker refuses every row: the n-th failure in a row
	// waits OutageBaseDelay·2^(n-1), at most OutageMaxDelay, jittered between half and all of
	// it. Defaults 100ms and 10s ([DefaultOutageBaseDelay], [DefaultOutageMaxDelay]).
	OutageBaseDelay, OutageMaxDelay time.Duration
	// PublishTimeout bounds the publish of one batch, every step of it, from the moment it
	// is claimed (and Polled returned), the wait for the batch before it included;
	// unconfirmed messages are then an outage, never published. Default 30s
	// ([DefaultPublishTimeout]).
	PublishTimeout time.Duration
	// ClaimTimeout bounds the claim transaction and its statements in PostgreSQL itself
	// (idle_in_transaction_session_timeout, statement_timeout): a relay paused, hung or cut
	// off mid-batch loses its claim after at most that, and other relays publish its rows.
	// At least PublishTimeout + 1s, since the transaction is idle while the batch is
	// published; default PublishTimeout + 5s ([DefaultClaimTimeoutMargin]).
	ClaimTimeout time.Duration
	// InFlightBatches is how many batches the relay keeps in flight at once, each holding a
	// connection of the pool (README.md#batches-in-flight); 1 is the serial relay. Default 2
	// ([DefaultInFlightBatches]), at most 16 ([MaxInFlightBatches]).
	InFlightBatches int
	// MaxMessageBytes is the largest payload the relay sends: a larger row is dead at once
	// ([ErrTooLarge]) rather than have the broker close the channel. Default 16 MiB
	// ([DefaultMaxMessageBytes], RabbitMQ 4's max_message_size; 3.x allows 128 MiB).
	MaxMessageBytes int
	// DeletePublished makes the relay delete the rows the broker confirmed, where it would
	// set their published_at: the table then holds only pending and dead rows, and
	// [Cleanup] has nothing left to do. On PostgreSQL a DELETE costs a fraction of the
	// UPDATE, which writes a new version of the row and of its index entries, and its
	// later cleanup: about a fifth of their time and a twenty-fifth of their WAL
	// (docs/benchmarks.md), which the WAL relay's walsender also reads. What goes is the
	// table's record of what was published, and when. [ReadStats], [ListDead], [Requeue],
	// the metrics and the alert rules read only pending and dead rows, and mean the same with it
	// (README.md#published-rows). Both relays honour it, the [WALRelay]'s retry lane too;
	// every relay of a table should run with the same setting.
	DeletePublished bool
	// Logger receives state changes and failures. nil discards.
	Logger *slog.Logger
	// Hooks observe the relay (metrics, crash points).
	Hooks Hooks

	// TracerProvider makes the relay's publish spans, one per message (README.md#tracing).
	// nil means the global provider, otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context [Add] recorded in a row's headers and writes the
	// publish span's into the headers sent: give it Add's. nil means the global one.
	Propagator propagation.TextMapPropagator
	// MessagingSystem is the publish spans' messaging.system attribute. Default: what the
	// publisher answers if it is a [MessagingSystemNamer] ("rabbitmq"); else none.
	MessagingSystem string
}

// Hooks are optional callbacks, for metrics and tests. A hook may be called from any of the
// relay's goroutines, concurrently with other hooks: make it safe for concurrent use, and
// fast (a slow Polled keeps the claimed rows locked and holds back vacuum; the others hold
// up their batch or cycle). A hook that panics unwinds [Relay.Run]: the batch in hand is
// rolled back, the others in flight finish, and the panic goes on in Run's caller, which may
// call Run again.
type Hooks struct {
	// Failpoint is called each time a cycle passes a Failpoint* point (to crash there).
	Failpoint func(FailpointHit)
	// Polled is called after every claim, idle ones included.
	Polled func(Poll)
	// BatchDone is called after a batch's outcome was committed.
	BatchDone func(BatchResult)
	// StateChanged is called when the relay's state changes.
	StateChanged func(StateChange)
	// WALProgress is called by a [WALRelay] when the oldest transaction it streamed and has
	// not settled yet changes: when one is streamed while none was, when the slot's position
	// moves past it, and (with none) when a session starts streaming, or ends as the relay
	// stops or stands by (one that fails reports nothing: it is as far behind as it was).
	// It may be called while the relay holds a lock of its stream: keep it fast.
	WALProgress func(WALProgress)
	// SlotCreated is called by a [WALRelay] once it has created its slot and handed the rows
	// pending then to its retry lane: a catch-up.
	SlotCreated func(SlotCreated)
}

// WALProgress is passed to [Hooks].WALProgress.
type WALProgress struct {
	// Oldest is the commit time (the server's clock) of the oldest transaction streamed and
	// not settled yet (each of its rows published or handed to the retry lane, and
	// marked); zero when there is none. The slot's position stays before it.
	Oldest time.Time
}

// SlotReason says why a [WALRelay] created its slot, in [SlotCreated].
type SlotReason string

const (
	// SlotNew: there was no slot, nor a record of an earlier one: the relay's first start.
	SlotNew SlotReason = "new"
	// SlotGone: the slot the relay had created is gone: dropped (by an operator, or by a
	// switch back to polling), or left on the old primary by a failover.
	SlotGone SlotReason = "gone"
	// SlotInvalidated: the server invalidated the slot (it kept more WAL than
	// max_slot_wal_keep_size); the relay dropped it.
	SlotInvalidated SlotReason = "invalidated"
	// SlotUnfinished: the slot's creator stopped before it handed the rows pending then to
	// the retry lane; the relay dropped it.
	SlotUnfinished SlotReason = "unfinished"
)

// SlotCreated is passed to [Hooks].SlotCreated.
type SlotCreated struct {
	// Reason says why the slot was created.
	Reason SlotReason
	// Handed is how many rows pending at the slot's creation were handed to the retry lane:
	// the stream does not have them, and the lane publishes them in their aggregate's order.
	Handed int64
}

// FailpointHit is passed to [Hooks].Failpoint.
type FailpointHit struct {
	// Name is the point passed, one of the Failpoint* constants.
	Name string
}

// Poll is passed to [Hooks].Polled.
type Poll struct {
	// Claimed is the number of rows the claim took, 0 when the relay is idle.
	Claimed int
}

// StateChange is passed to [Hooks].StateChanged.
type StateChange struct {
	// From and To are the states before and after the change.
	From, To State
	// Err is the cause of the change, if any (the outage behind an unavailable state).
	Err error
}

// BatchResult is the committed outcome of one relay cycle, passed to [Hooks].BatchDone.
type BatchResult struct {
	// Published rows are confirmed by the broker and marked published (deleted, with
	// [Config].DeletePublished).
	Published []Message
	// PublishedSpans are the span contexts of the Published rows' publish spans, at the same
	// index (for exemplars); the zero SpanContext for a span not sampled, and nil when none
	// was, as always without tracing.
	PublishedSpans []trace.SpanContext
	// ConfirmedAt is when the broker's confirms arrived.
	ConfirmedAt time.Time
	// Failed rows counted an attempt; Dead ones among them will not be retried.
	Failed []Failure
	// Untouched counts rows left as they were: the broker was unavailable, or the publisher
	// did not send them.
	Untouched int
	// Deferred counts rows the broker refused for a reason of its own ([ErrRefused]),
	// retried later without counting an attempt.
	Deferred int
}

// Failure is a row whose publish attempt failed.
type Failure struct {
	Message Message
	Err     error
	// Dead is true when the row will not be retried (MaxAttempts reached, or permanent).
	Dead bool
}

// WithDefaults returns c with every default filled in, as a relay given c runs with (but for
// MessagingSystem, which [NewRelay] asks the publisher for), or an error listing every
// invalid field.
func (c Config) WithDefaults() (Config, error) {
	c.Tables = c.Tables.WithDefaults()
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.NotifyRecheck = min(cmp.Or(c.NotifyRecheck, DefaultNotifyRecheck), c.PollInterval)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.RetryBaseDelay = cmp.Or(c.RetryBaseDelay, DefaultRetryBaseDelay)
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, DefaultRetryMaxDelay)
	c.OutageBaseDelay = cmp.Or(c.OutageBaseDelay, DefaultOutageBaseDelay)
	c.OutageMaxDelay = cmp.Or(c.OutageMaxDelay, DefaultOutageMaxDelay)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, c.PublishTimeout+DefaultClaimTimeoutMargin)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.InFlightBatches = cmp.Or(c.InFlightBatches, DefaultInFlightBatches)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	var errs []error
	if c.BatchSize < 0 || c.BatchSize > 10_000 {
		errs = append(errs, fmt.Errorf("batch size must be between 0 (default %d) and 10000, got %d", DefaultBatchSize, c.BatchSize))
	}
	// MaxInFlightBatches: beyond a few batches in flight, the broker or the database is the
	// limit, not the overlap.
	if c.InFlightBatches < 0 || c.InFlightBatches > MaxInFlightBatches {
		errs = append(errs, fmt.Errorf("in-flight batches must be between 0 (default %d) and %d, got %d", DefaultInFlightBatches, MaxInFlightBatches, c.InFlightBatches))
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max attempts must be >= 0 (default %d), got %d", DefaultMaxAttempts, c.MaxAttempts))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"poll interval", c.PollInterval},
		{"notify recheck", c.NotifyRecheck},
		{"retry base delay", c.RetryBaseDelay},
		{"retry max delay", c.RetryMaxDelay},
		{"outage base delay", c.OutageBaseDelay},
		{"outage max delay", c.OutageMaxDelay},
		{"publish timeout", c.PublishTimeout},
		{"claim timeout", c.ClaimTimeout},
	} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s must be >= 0 (0 means the default), got %s", d.name, d.value))
		}
	}
	if c.RetryMaxDelay < c.RetryBaseDelay {
		errs = append(errs, fmt.Errorf("retry max delay (%s) must not be below retry base delay (%s)", c.RetryMaxDelay, c.RetryBaseDelay))
	}
	if c.OutageMaxDelay < c.OutageBaseDelay {
		errs = append(errs, fmt.Errorf("outage max delay (%s) must not be below outage base delay (%s)", c.OutageMaxDelay, c.OutageBaseDelay))
	}
	if c.ClaimTimeout < c.PublishTimeout+time.Second {
		errs = append(errs, fmt.Errorf("claim timeout (%s) must exceed publish timeout (%s) by a second at least", c.ClaimTimeout, c.PublishTimeout))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max message bytes must be >= 0 (0 means the default, %d), got %d", DefaultMaxMessageBytes, c.MaxMessageBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("outbox: invalid relay config: %w", err)
	}
	if err := c.Tables.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// Relay publishes committed outbox rows to a broker. Several relays may run against one
// table, in one process or many (README.md#guarantees).
type Relay struct {
	db RelayDB
	// listenDB gives the LISTEN connection; nil when db cannot (DisableNotify is set then).
	listenDB connAcquirer
	pub      Publisher
	// concurrentSends: pub is a ConcurrentPublisher serving more than one call at once, so
	// a batch in flight is sent without waiting for the one before it.
	concurrentSends bool
	cfg             Config
	sql             statements // for cfg.Tables
	tracer          trace.Tracer

	running atomic.Bool
	mu      sync.Mutex
	state   State
	// downSince is when the relay last became unable to do its job (an unavailable state
	// after another), and lastErr the last error of the cycles since; for Ready.
	downSince time.Time
	lastErr   error
	hookMu    sync.Mutex // held while a hook runs: the relay calls its hooks one at a time

	// rules are what settle applies to each batch's answers, and rowStreaks the streaks of
	// the rows that came back unsent or refused, from one cycle to the next.
	rules      settleRules
	rowStreaks rowStreaks

	// maint takes rows that wait behind their aggregate's head out of the claim's way.
	maint *maintenance
	// claimSQL is the claim: sql.claimBatch, or for a WAL relay's retry lane
	// sql.claimHanded, which takes only the rows the stream handed over (walrelay.go). A
	// lane runs no maintenance passes: the stream's rows, which it leaves alone, are what
	// they would walk.
	claimSQL string
	lane     bool

	// The failure streaks of the relay's loops: each spaces its loop's attempts with the
	// outage backoff and logs a failure once (package retry).
	cycles   *retry.Streak // the cycles: the database or the broker is away
	refusals *retry.Streak // cycles in which the broker refused messages
	// Unix nanoseconds of the last refusal, and of the last batch of which the broker
	// accepted a message (see endRefusals).
	lastRefusal, lastAccepted atomic.Int64
	listening                 *retry.Streak // the LISTEN connection
}

// RelayDB is what a relay needs of the database: transactions for its batches and statements
// for its maintenance. A *pgxpool.Pool satisfies it, and so does a wrapper of your own (to
// count or trace statements, say). When db has them with the pool's exact signatures, the
// relay also uses Stat, for [Relay.PoolSize], and Acquire(ctx) (*pgxpool.Conn, error), for
// its LISTEN connection, taken out of the pool while it runs; without Acquire, [NewRelay]
// wants [Config].DisableNotify.
type RelayDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// connAcquirer gives the relay a connection it can take out of the pool for LISTEN (pgxpool's
// Hijack). Go matches method types exactly, so no narrower Acquire would still be the pool's:
// a wrapper of a pool forwards Acquire to it.
type connAcquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

var (
	_ RelayDB      = (*pgxpool.Pool)(nil)
	_ connAcquirer = (*pgxpool.Pool)(nil)
)

// NewRelay returns a relay that publishes the rows of cfg.Tables' outbox table in pool's
// database through pub. It fills in and checks cfg ([Config.WithDefaults]), and logs a
// warning when the pool is smaller than the relay needs ([Relay.PoolSize]).
func NewRelay(pool RelayDB, pub Publisher, cfg Config) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a publisher")
	}
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	listenDB, _ := pool.(connAcquirer)
	if listenDB == nil && !cfg.DisableNotify {
		return nil, errors.New("outbox: NewRelay: the pool has no Acquire method for the LISTEN connection; set DisableNotify to poll instead")
	}
	store, err := NewStore(cfg.Tables)
	if err != nil {
		return nil, err
	}
	if sn, ok := pub.(MessagingSystemNamer); ok && cfg.MessagingSystem == "" {
		cfg.MessagingSystem = sn.MessagingSystem()
	}
	r := &Relay{db: pool, listenDB: listenDB, pub: pub, cfg: cfg, sql: store.sql, claimSQL: store.sql.claimBatch,
		state: StateStarting, tracer: cfg.TracerProvider.Tracer(TracerName)}
	outage := retry.Backoff{Base: cfg.OutageBaseDelay, Max: cfg.OutageMaxDelay}
	streak := func(what string) *retry.Streak {
		return &retry.Streak{What: what, Logger: cfg.Logger, Backoff: outage}
	}
	r.cycles = streak("outbox relay")
	r.refusals = streak("outbox relay: the broker refuses messages")
	r.listening = streak("outbox relay: LISTEN connection (polling meanwhile)")
	r.maint = newMaintenance(pool, store.sql, cfg, streak("outbox relay: maintenance pass"))
	r.rules = settleRules{
		maxAttempts: cfg.MaxAttempts,
		retryDelay:  retry.Backoff{Base: cfg.RetryBaseDelay, Max: cfg.RetryMaxDelay}.Delay,
	}
	if cp, ok := pub.(ConcurrentPublisher); ok {
		r.concurrentSends = cp.ConcurrentPublishes() > 1
	}
	size := r.PoolSize()
	if size.Shortfall() > 0 {
		cfg.Logger.Warn("outbox relay: the pool is smaller than the relay needs; it will wait for connections",
			"pool_max_conns", size.Max, "connections_needed", size.Needed)
	}
	return r, nil
}

// PoolSize compares the connections a relay may hold at once with the size of its pool.
type PoolSize struct {
	// Needed is how many connections of the pool the relay may hold at once:
	// [Config].InFlightBatches + 1, one for each batch in flight and one now and then for its
	// maintenance. Not counted: the LISTEN connection, out of the pool, nor with synchronous
	// standbys the one a claim's barrier needs (README.md#sizing-the-pool).
	Needed int
	// Max is the pool's largest size, read from its Stat method (*pgxpool.Pool has one); 0
	// when the pool does not tell.
	Max int
}

// Shortfall is how many connections the pool lacks for Needed: 0 when it is large enough
// or its size is unknown.
func (s PoolSize) Shortfall() int {
	if s.Max <= 0 {
		return 0
	}
	return max(0, s.Needed-s.Max)
}

// PoolSize reports what the relay needs of its pool, and the pool's size when the pool
// tells it.
func (r *Relay) PoolSize() PoolSize {
	// A transaction per batch in flight, and maintenance. The LISTEN connection is hijacked
	// from the pool (see listenOnce): it frees its slot, and is not counted against MaxConns.
	return PoolSize{Needed: r.cfg.InFlightBatches + 1, Max: poolMax(r.db)}
}

// State reports what the relay is doing now.
func (r *Relay) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// Ready returns nil while Run runs and the relay can do its job, or has been unable to for at
// most maxUnavailable: the broker or the database unavailable to it
// ([StateBrokerUnavailable], [StateDatabaseUnavailable]). Otherwise it returns an error that
// says what is down, since when, and the last error; or that Run is not running (not started
// yet, or returned). An idle relay does not try the broker: it notices an outage with the
// next row it publishes.
func (r *Relay) Ready(maxUnavailable time.Duration) error {
	r.mu.Lock()
	state, since, lastErr := r.state, r.downSince, r.lastErr
	r.mu.Unlock()
	return readiness("relay", r.running.Load(), state, since, lastErr, maxUnavailable)
}

// readiness is what Ready says of a relay (what) that is running or not, in state, unable
// to do its job since since, with lastErr: see [Relay.Ready].
func readiness(what string, running bool, state State, since time.Time, lastErr error, maxUnavailable time.Duration) error {
	if !running {
		if state == StateStarting {
			return fmt.Errorf("outbox: %s not started", what)
		}
		return fmt.Errorf("outbox: %s stopped", what)
	}
	var down string
	switch state {
	case StateBrokerUnavailable:
		down = "cannot publish to the broker"
	case StateDatabaseUnavailable:
		down = "cannot reach the database"
	default:
		return nil
	}
	d := time.Since(since)
	if d <= maxUnavailable {
		return nil
	}
	// No "outbox: " prefix: lastErr's chain has one already (the sentinels').
	return fmt.Errorf("%s for %s (since %s): %w",
		down, d.Round(time.Second), since.UTC().Format(time.RFC3339), lastErr)
}

// Run publishes rows until ctx is cancelled, then finishes every batch in flight and returns
// nil. It rides out the broker and the database going away, waiting with the outage backoff
// ([Config].OutageBaseDelay) and logging each failure once (README.md#operations). Run may be
// called again after it returned, but not twice at once.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay is already running")
	}
	defer r.running.Store(false)

	wake := make(chan struct{}, 1)
	defer r.startBackground(ctx, wake)()
	p := &pipeline{r: r, limit: r.cfg.InFlightBatches}
	defer p.abandon() // a panic unwinding Run: the batches in flight still end

	pace := r.newPacer()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if ctx.Err() != nil {
			p.drain()
			r.setState(StateStopped, nil)
			return nil
		}
		c, err := p.step(ctx)
		if ctx.Err() != nil {
			continue // stopping: an error caused by the cancellation is no outage
		}
		if err != nil {
			r.setState(stateFor(err), err)
		} else {
			r.cycles.Succeed(ctx)
			r.endRefusals(ctx)
			r.setState(StateRunning, nil)
		}
		next := pace.after(c, err != nil)
		if next.now {
			continue
		}
		wait, wakeUp := next.wait, wake
		if next.outage {
			// The outage backoff, and one line when it starts, one per
			// retry.DefaultLogInterval while it lasts, one when it ends.
			wait = r.cycles.Fail(ctx, err)
		}
		if !next.wakeable {
			wakeUp = nil
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
		case <-wakeUp:
			pace.woken()
		case <-timer.C:
		}
	}
}

// startBackground starts Run's goroutines beside its cycles: the LISTEN connection, which
// turns notifications into wake-ups (unless DisableNotify is set), and the maintenance
// passes. It returns the function that stops them and waits for them to end.
func (r *Relay) startBackground(ctx context.Context, wake chan<- struct{}) (stop func()) {
	bctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if !r.cfg.DisableNotify {
		wg.Go(func() { r.listen(bctx, wake) })
	}
	r.maint.inRun.Store(true)
	if !r.lane {
		wg.Go(func() { r.maint.loop(bctx, wake) })
	}
	return func() {
		cancel()
		wg.Wait()
		r.maint.inRun.Store(false)
	}
}

// endRefusals ends the refusals' streak, if there is one, once refusalsEnded says so. Run
// calls it after every cycle that did not fail, idle ones included.
func (r *Relay) endRefusals(ctx context.Context) {
	if refusalsEnded(r.lastRefusal.Load(), r.lastAccepted.Load(), time.Now()) {
		r.refusals.Succeed(ctx)
	}
}

// refusalsOver is how long the broker must accept what the relay publishes, refusing
// nothing, before a streak of refusals is over.
const refusalsOver = time.Second

// refusalsEnded reports whether, at now, a streak of refusals is over: the broker has
// accepted a message since the last refusal (lastAccepted and lastRefusal in Unix
// nanoseconds; 0: never) and refused nothing for refusalsOver. Not at the first accepted
// batch, since a queue at its length limit accepts some batches and refuses others, and a
// streak that each accepted batch ended would say so once per batch.
func refusalsEnded(lastRefusal, lastAccepted int64, now time.Time) bool {
	return lastRefusal != 0 && lastAccepted >= lastRefusal && now.Sub(time.Unix(0, lastRefusal)) >= refusalsOver
}

// Errors that decide the relay's state.
type (
	databaseError struct{ error }
	brokerError   struct{ error }
)

func (e databaseError) Unwrap() error { return e.error }
func (e brokerError) Unwrap() error   { return e.error }

func stateFor(err error) State {
	var be brokerError
	if errors.As(err, &be) {
		return StateBrokerUnavailable
	}
	return StateDatabaseUnavailable
}

func (r *Relay) setState(to State, cause error) {
	r.mu.Lock()
	from := r.state
	r.state = to
	if unavailable(to) {
		if !unavailable(from) {
			r.downSince = time.Now()
		}
		r.lastErr = cause
	}
	r.mu.Unlock()
	if from == to {
		return
	}
	// The cause is logged by the cycles' streak, once per outage rather than once per state.
	r.cfg.Logger.Info("outbox relay state", "state", to, "previous", from)
	if h := r.cfg.Hooks.StateChanged; h != nil {
		r.hook(func() { h(StateChange{From: from, To: to, Err: cause}) })
	}
}

// unavailable tells the states in which the relay cannot do its job.
func unavailable(s State) bool {
	return s == StateBrokerUnavailable || s == StateDatabaseUnavailable
}

func (r *Relay) failpoint(name string) {
	if fp := r.cfg.Hooks.Failpoint; fp != nil {
		r.hook(func() { fp(FailpointHit{Name: name}) })
	}
}

// hook runs f, a call of a hook, while no other hook of the relay runs: more than [Hooks]
// promises, which costs nothing while hooks are fast.
func (r *Relay) hook(f func()) {
	r.hookMu.Lock()
	defer r.hookMu.Unlock()
	f()
}

// listen turns notifications into wake-ups on a connection of its own, reconnecting with
// the outage backoff (reset once it listens again). Polling covers every moment it is not
// listening.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for {
		err := r.listenOnce(ctx, wake, func() { r.listening.Succeed(ctx) })
		if ctx.Err() != nil {
			return
		}
		if !retry.Sleep(ctx, r.listening.Fail(ctx, err)) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, listening func()) error {
	pc, err := r.listenDB.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	// A LISTENing connection must not go back to the pool: it is ours until it fails.
	// Hijacking it also frees its slot in the pool, so the cycles never wait for it.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a dead or idle connection
	if _, err := conn.Exec(ctx, r.sql.listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	listening()
	signal(wake) // rows may have committed while nobody listened
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		signal(wake)
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

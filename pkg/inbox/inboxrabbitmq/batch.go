package inboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Batched inbox transactions (BatchSize > 1): a worker takes the deliveries that have
// arrived, up to BatchSize, into one transaction (inbox.Store.ProcessBatch: once a message
// failed, the batch again with a savepoint per message), commits once and acknowledges
// them together. What goes wrong for one message stays with it; what goes wrong for the
// transaction costs none of them anything.

// gather returns first and the deliveries that arrived after it, up to the batch size in
// all (BatchSize, or less after lock conflicts: see batchSizer). It
// waits at most BatchWait for more; it takes none once the consumer is stopping, and those
// left in the channel are handed back by work.
func (c *Consumer) gather(s *session, first inbound, deliveries <-chan inbound) []inbound {
	size := c.batches.size(time.Now())
	batch := make([]inbound, 1, size)
	batch[0] = first
	var wait <-chan time.Time
	if c.cfg.BatchWait > 0 {
		t := time.NewTimer(c.cfg.BatchWait)
		defer t.Stop()
		wait = t.C
	}
	for len(batch) < size && !s.stopping.Load() {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
			continue
		default:
		}
		if wait == nil {
			return batch
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		case <-wait:
			return batch
		case <-s.waitCtx.Done():
			return batch
		}
	}
	return batch
}

// handleBatch takes a batch of deliveries to their ends, as handle does one. Messages
// refused before a transaction are dead-lettered on their own; the others are processed in
// one transaction. Those that failed in it, and all of them when the transaction itself
// failed, then go on alone, each in a goroutine of its own (s.solos), as handle takes them:
// each message's own failure follows its failure class, and a failed transaction counts for
// none of them. The worker does not wait for them: in an outage every delivery in hand is
// held, not waiting behind a held one, and there are at most Prefetch of them.
func (c *Consumer) handleBatch(s *session, ins []inbound) {
	var (
		batch []*message
		alone []solo
	)
	for _, in := range ins {
		m := c.newMessage(s, in)
		if reason, detail := refusal(c.cfg, m.del); reason != "" {
			alone = append(alone, solo{m, c.deadLetterStage(s, m, reason, detail)})
			continue
		}
		batch = append(batch, m)
	}
	alone = append(alone, c.processBatch(s, batch)...)
	for _, a := range alone {
		s.solos.Go(func() { c.run(s, a.m, a.next) })
	}
}

// batchBeginSQL begins a batch's transaction with a lock timeout of 100 ms, in one round
// trip (pgx sends a statement without arguments in the simple protocol, which takes two).
// A batch holds the locks of all its messages until it commits, so batches that update the
// same hot rows in other orders deadlock, and PostgreSQL takes deadlock_timeout (1s by
// default, settable only by a superuser) to notice. A wait longer than the timeout is a
// conflict: the batch is cut there (errBatchCut), and the message that waited goes on
// alone, in a transaction of its own, which waits as long as it needs. A shorter wait ends
// by itself.
const batchBeginSQL = `BEGIN; SET LOCAL lock_timeout = '100ms'`

// batchLockTimeoutSQL sets the lock timeout after a plain begin, for a TxBeginner that
// cannot begin with batchBeginSQL.
const batchLockTimeoutSQL = `SET LOCAL lock_timeout = '100ms'`

// lockTimed begins the batches' transactions with their lock timeout set, outside any
// message's savepoint, whose rollback would undo it. A failure to set it fails the begin:
// the batch's messages then go on alone, charged nothing. newLockTimed returns it for db.
type lockTimed struct{ db inbox.TxBeginner }

// lockTimedOptions is lockTimed on a db that takes transaction options (a pool or a
// connection): it passes them on, with the lock timeout in the begin, so that
// inbox.Store.ProcessBatch can set what it sets there (a commit that saves a round trip).
type lockTimedOptions struct {
	lockTimed
	opts txOptionsBeginner
}

// txOptionsBeginner is what a *pgxpool.Pool and a *pgx.Conn offer beyond Begin.
type txOptionsBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

func newLockTimed(db inbox.TxBeginner) inbox.TxBeginner {
	if opts, ok := db.(txOptionsBeginner); ok {
		return lockTimedOptions{lockTimed{db}, opts}
	}
	return lockTimed{db}
}

func (l lockTimedOptions) Begin(ctx context.Context) (pgx.Tx, error) {
	return l.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx begins with batchBeginSQL; opts must not set a begin of their own.
func (l lockTimedOptions) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if opts.BeginQuery != "" || opts.IsoLevel != "" || opts.AccessMode != "" || opts.DeferrableMode != "" {
		return nil, errors.New("inbox: a batch's transaction takes no begin options but its lock timeout")
	}
	opts.BeginQuery = batchBeginSQL
	return l.opts.BeginTx(ctx, opts)
}

func (l lockTimed) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, batchLockTimeoutSQL); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
		return nil, fmt.Errorf("set the batch's lock timeout: %w", err)
	}
	return tx, nil
}

// errBatchCut is what the messages of a batch after a lost lock conflict return instead of
// calling the handler: the batch commits what came before, which releases its locks, and
// they go on alone, not charged for anything.
var errBatchCut = errors.New("the batch was cut short by a lock conflict")

// errBatchStopped is what the messages of a batch return instead of calling the handler
// once the consumer is asked to stop: the batch commits what it handled, and they are handed
// back, as the deliveries no worker had started.
var errBatchStopped = errors.New("the consumer is stopping")

// solo is a message of a batch that goes on alone, from its next stage.
type solo struct {
	m    *message
	next step
}

// processBatch processes batch in one transaction, acknowledges the messages it processed
// and returns the others with their next stage.
func (c *Consumer) processBatch(s *session, batch []*message) []solo {
	if len(batch) == 0 {
		return nil
	}
	ctx := s.workCtx // a batch is a first attempt: held messages go on alone
	msgs := make([]inbox.Message, len(batch))
	for i, m := range batch {
		msgs[i] = inbox.Message{ID: m.d.MessageId, Type: m.d.Type, ReceivedAt: m.start}
	}
	handlerErrs := make([]error, len(batch))
	var (
		pass    pgx.Tx // the transaction of the attempt at the batch under way
		cut     bool   // a handler lost a lock conflict: the rest of the batch goes on alone
		started = make([]bool, len(batch))
	)
	results, err := c.store.ProcessBatch(ctx, c.lockTimed, c.cfg.Name, msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
		if tx != pass {
			// ProcessBatch runs the batch again, with a savepoint per message, after a
			// message failed in its first attempt, which it rolled back.
			pass, cut = tx, false
		}
		if cut {
			return errBatchCut
		}
		if s.stopRequested() && !started[i] {
			// Handed back, as a delivery not started at a stop. One started in the
			// batch's first attempt is in flight: it runs again, to its end.
			return errBatchStopped
		}
		started[i] = true
		m := batch[i]
		err := c.callHandler(withSpan(ctx, m), tx, m.del, m.log)
		handlerErrs[i] = err
		if err != nil {
			cut = lockConflict(err)
			return err
		}
		c.failpoint(FailpointBeforeCommit)
		return nil
	})
	if err != nil {
		c.batches.ran(time.Now(), lockConflict(err))
		if len(batch) == 1 { // its own failure, as without batches
			next, err := c.afterFailure(ctx, s, batch[0], err, handlerErrs[0])
			return []solo{{batch[0], replay(next, err)}}
		}
		return c.batchFailed(ctx, s, batch, err)
	}
	conflict := false
	for _, r := range results {
		conflict = conflict || lockConflict(r.Err)
	}
	c.batches.ran(time.Now(), conflict)

	var (
		alone []solo
		tags  []uint64
	)
	for i, r := range results {
		if errors.Is(r.Err, errBatchCut) {
			alone = append(alone, solo{batch[i], c.processStage(s, batch[i])}) // not attempted
			continue
		}
		if errors.Is(r.Err, errBatchStopped) {
			alone = append(alone, solo{batch[i], replay(c.processStage(s, batch[i]), fmt.Errorf("%w: %w", errInterrupted, errBatchStopped))})
			continue
		}
		if r.Err != nil {
			next, err := c.afterFailure(ctx, s, batch[i], r.Err, handlerErrs[i])
			alone = append(alone, solo{batch[i], replay(next, err)})
			continue
		}
		if !r.Duplicate {
			c.failpoint(FailpointAfterCommit) // once per message committed, as without batches
		}
		tags = append(tags, batch[i].d.DeliveryTag)
	}
	// Acknowledge only now that the effects are committed, together.
	s.acks.ack(tags...)
	for i, r := range results {
		if r.Err == nil {
			if r.Duplicate {
				markDuplicate(batch[i])
			}
			c.finishProcessed(s, batch[i], r.Duplicate)
		}
	}
	c.settled(ctx)
	return alone
}

// batchFailed returns the messages of a batch whose transaction failed with err, each to be
// processed again on its own: none of them is charged for it. A transient failure (the
// database unreachable) then holds each of them; another (a deferred constraint that fails
// at commit) finds the message at fault, which alone follows its failure class. On a stop
// or a lost connection they are handed back.
func (c *Consumer) batchFailed(ctx context.Context, s *session, batch []*message, err error) []solo {
	alone := make([]solo, len(batch))
	for i, m := range batch {
		if h := c.cfg.Hooks.HandlerError; h != nil {
			h(HandlerFailure{Consumer: c.cfg.Name, Type: m.d.Type, Err: err})
		}
		next := c.processStage(s, m)
		if ctx.Err() != nil || s.stopped() {
			next = replay(next, fmt.Errorf("%w: %w", errInterrupted, err))
		}
		alone[i] = solo{m, next}
	}
	c.log.DebugContext(ctx, "batch transaction failed; processing its messages one by one",
		slog.Int("batch_size", len(batch)), slog.Any("error", err), slog.Bool("transient", inbox.IsTransient(err)))
	return alone
}

// replay is a stage that returns next and err at once: the outcome of an attempt made in a
// batch, for run to carry on from.
func replay(next step, err error) step {
	return func() (step, error) { return next, err }
}

// markDuplicate marks m's span as a duplicate's, as inbox.Process marks the span of its
// context.
func markDuplicate(m *message) {
	if m.span != nil && m.span.IsRecording() {
		m.span.SetAttributes(inbox.AttrDuplicate.Bool(true))
	}
}

// batchSizer adapts the size of the consumer's batches to lock conflicts between them. A
// batch holds the row locks of all its messages until it commits, so two batches whose
// handlers update the same few hot rows in another order deadlock, and PostgreSQL takes
// deadlock_timeout (1s by default) to find out: at full size they would do so on nearly
// every batch. So a batch that meets a lock conflict (a deadlock, a lock or serialization
// failure) halves the size of the batches after it, down to 1, and the size grows back by
// one per second without a conflict, up to BatchSize.
type batchSizer struct {
	max int

	mu      sync.Mutex
	current int
	// since is when current last changed.
	since time.Time
}

func newBatchSizer(limit int) *batchSizer {
	return &batchSizer{max: limit, current: limit}
}

// size returns the size of the next batch, at now.
func (b *batchSizer) size(now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current < b.max {
		if grow := int(now.Sub(b.since) / time.Second); grow > 0 {
			b.current = min(b.max, b.current+grow)
			b.since = now
		}
	}
	return b.current
}

// ran records a batch's transaction at now, and whether it met a lock conflict.
func (b *batchSizer) ran(now time.Time, conflict bool) {
	if !conflict {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current = max(1, b.current/2)
	b.since = now
}

// lockConflict reports whether err is a lost race for a lock with another transaction: a
// deadlock, a lock that could not be had, a serialization failure.
func lockConflict(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return false
	}
	switch pgErr.Code {
	case "40P01", "40001", "55P03": // deadlock_detected, serialization_failure, lock_not_available
		return true
	}
	return false
}

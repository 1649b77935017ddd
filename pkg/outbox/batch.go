package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/trace"
)

// claimBatch locks up to $1 due rows, oldest first, skipping rows another relay holds.
//
// Only the oldest pending row of each aggregate qualifies (the scalar subquery): a row waits
// until every older pending row of its aggregate is published or dead. Together with SKIP
// LOCKED this keeps per-aggregate order across any number of relays: while one relay holds
// the head row of an aggregate, the others skip it, and the next row does not qualify because
// the head is still pending in their snapshot.
//
// The walk follows the claimable index (pending and not waiting) in seq order. A row that is
// not its aggregate's head is rejected by the subquery at the cost of one index probe; so
// that a long backlog of one aggregate is not walked by every claim, [markWaiting] takes such
// rows out of that index. The claim's cost is then about the batch, whatever one aggregate's
// backlog.
//
// The check is written as "seq = (SELECT min(seq) …)" rather than NOT EXISTS on purpose: the
// planner cannot turn a scalar subquery into a join, so it always walks the index in seq
// order and probes one index entry per candidate, stopping at the LIMIT. NOT EXISTS let it
// pick an anti join that scanned the whole backlog for every row on a freshly filled table
// (100x slower before the first ANALYZE).
//
// The claim keeps no cursor ("published up to seq N"). A row whose seq is smaller than rows
// already published but whose transaction committed later is simply pending, and the next
// claim takes it: nothing is ever skipped for good.
const claimBatch = `
SELECT o.id, o.exchange, o.routing_key, o.type, o.aggregate_type, o.aggregate_id,
       o.payload::text, o.headers::text, o.created_at, o.attempts
FROM {{.Messages}} o
WHERE o.published_at IS NULL AND o.dead_at IS NULL AND NOT o.waiting AND o.next_attempt_at <= now()
  AND o.seq = (
      SELECT min(head.seq) FROM {{.Messages}} head
      WHERE head.aggregate_type = o.aggregate_type AND head.aggregate_id = o.aggregate_id
        AND head.published_at IS NULL AND head.dead_at IS NULL)
ORDER BY o.seq
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`

// claimSettings bounds the claim transaction in the database itself ($1 and $2 in
// milliseconds): if the relay is paused (SIGSTOP), hung, or cut off from the database, the
// server ends its session after idle_in_transaction_session_timeout and the rows go back to
// the other relays. statement_timeout bounds each statement of the cycle.
//
// It also turns JIT compilation off for the cycle. The claim's plan walks an index and stops
// at its LIMIT, but the planner prices it as if it might walk the whole backlog: past about
// 100,000 pending rows that estimate crosses PostgreSQL's jit_above_cost, and every claim
// then compiled itself for about 6 ms to run for 1.5 ms (EXPLAIN ANALYZE on 200,000 rows),
// which made PostgreSQL the relay's bottleneck on a long backlog.
//
// It returns what the relay needs to know of the server for the batch: whether it has
// synchronous standbys, and its start time (see awaitReplication); and whether the relay's
// role may delete from table $3, when $3 names one ([Config].DeletePublished), so that a
// relay that could not delete what it publishes publishes nothing.
const claimSettings = `
SELECT set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('statement_timeout', $2, true),
       set_config('jit', 'off', true),
       current_setting('synchronous_standby_names') <> '',
       pg_postmaster_start_time(),
       CASE WHEN $3::text = '' THEN true ELSE has_table_privilege($3::text, 'DELETE') END`

// errNoDelete: the relay's role may not delete from the table, and DeletePublished is set.
var errNoDelete = errors.New("the relay's role may not DELETE from the outbox table, and Config.DeletePublished is set")

// markPublished marks exactly the confirmed rows. clock_timestamp, not now(): now() is when
// the claim began.
const markPublished = `
UPDATE {{.Messages}} SET published_at = clock_timestamp() WHERE id = ANY($1::uuid[])`

// deleteConfirmed is markPublished for a relay with [Config].DeletePublished: it deletes
// the confirmed rows, and returns how many of them it left in the table (the outer query
// reads the table as it was before the DELETE): none, unless a trigger, a rule or a row
// security policy kept the DELETE from them. A dead row is not deleted (the WAL relay may
// stream a row again after a restart, dead since): it stays for ListDead and Requeue.
const deleteConfirmed = `
WITH d AS (DELETE FROM {{.Messages}} WHERE id = ANY($1::uuid[]) AND dead_at IS NULL RETURNING id)
SELECT count(*) FROM {{.Messages}} o
WHERE o.id = ANY($1::uuid[]) AND o.dead_at IS NULL AND o.id NOT IN (SELECT id FROM d)`

// markConfirmed records the rows the broker confirmed, in tx: markPublished, or with
// [Config].DeletePublished deleteConfirmed, which fails when it could not delete them all.
// The tag is markPublished's (how many rows it found); empty after deleteConfirmed.
func (r *Relay) markConfirmed(ctx context.Context, tx pgx.Tx, ids []pgtype.UUID) (pgconn.CommandTag, error) {
	if !r.cfg.DeletePublished {
		return tx.Exec(ctx, r.sql.markPublished, ids)
	}
	var left int64
	if err := tx.QueryRow(ctx, r.sql.deleteConfirmed, ids).Scan(&left); err != nil {
		return pgconn.CommandTag{}, err
	}
	if left > 0 {
		return pgconn.CommandTag{}, fmt.Errorf("%d of %d confirmed rows not deleted: a trigger, a rule or a row security policy of the table keeps the relay's DELETE from them (Config.DeletePublished)",
			left, len(ids))
	}
	return pgconn.CommandTag{}, nil
}

// markFailed counts an attempt against each failed row, schedules its retry from the moment
// of the failure, and buries the rows that gave up.
const markFailed = `
UPDATE {{.Messages}} o
SET attempts        = o.attempts + 1,
    last_error      = f.error,
    next_attempt_at = clock_timestamp() + f.delay_ms * interval '1 millisecond',
    dead_at         = CASE WHEN f.dead THEN clock_timestamp() END
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[]) AS f(id, error, delay_ms, dead)
WHERE o.id = f.id`

// markDeferred schedules a row later without counting an attempt: the broker refused it for
// a reason of its own (a full queue, say), or it was not sent several times in a row.
const markDeferred = `
UPDATE {{.Messages}} o
SET last_error      = f.error,
    next_attempt_at = clock_timestamp() + f.delay_ms * interval '1 millisecond'
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms)
WHERE o.id = f.id`

// releaseNext makes the new head of each aggregate whose head this cycle published or
// buried claimable again, if it was waiting. It runs in the claim transaction after the
// marks, so the old head is no longer pending here. It returns how many such heads it found
// and how many it released: a head that another transaction holds locked is skipped rather
// than waited for (another relay's claim may hold it, having walked past it, for as long as
// that relay's batch takes), and left to repairWaiting, which the relay then runs at once.
//
// Why no waiting row is left behind: markWaiting sets waiting only while it holds a KEY SHARE
// lock on an older pending row of the aggregate, and skips rows that a relay holds. A relay
// holds its claimed rows FOR UPDATE from its claim to its commit, so markWaiting can never
// lean on a head that is being published; and a relay that claims a head after markWaiting
// committed runs this statement later still, so it sees, and clears, what markWaiting set.
const releaseNext = `
WITH head AS MATERIALIZED (
    SELECT h.id
    FROM unnest($1::text[], $2::text[]) AS a(aggregate_type, aggregate_id),
    LATERAL (
        SELECT o.id, o.waiting FROM {{.Messages}} o
        WHERE o.aggregate_type = a.aggregate_type AND o.aggregate_id = a.aggregate_id
          AND o.published_at IS NULL AND o.dead_at IS NULL
        ORDER BY o.seq
        LIMIT 1) h
    WHERE h.waiting
), locked AS (
    SELECT l.id FROM {{.Messages}} l
    WHERE l.id = ANY (ARRAY(SELECT id FROM head)) AND l.waiting
    FOR NO KEY UPDATE SKIP LOCKED
), released AS (
    UPDATE {{.Messages}} m SET waiting = false FROM locked WHERE m.id = locked.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM head), (SELECT count(*) FROM released)`

// markWaiting takes up to $1 rows out of the claim's index that cannot be claimed because an
// older row of their aggregate is pending, among the $2 oldest claimable rows, which is where
// the claim walks and a hot aggregate's backlog sits (see maintenance, which runs it). It is
// one statement, so it holds its locks for milliseconds; it never waits for a lock (SKIP
// LOCKED everywhere). A row is marked only while the older row it waits for is locked FOR
// KEY SHARE here, which a relay publishing that older row (holding it FOR UPDATE) prevents:
// see releaseNext.
const markWaiting = `
WITH candidate AS MATERIALIZED (
    SELECT c.id
    FROM (
        SELECT w.id, w.seq, w.aggregate_type, w.aggregate_id FROM {{.Messages}} w
        WHERE w.published_at IS NULL AND w.dead_at IS NULL AND NOT w.waiting
        ORDER BY w.seq
        LIMIT $2) c
    WHERE c.seq > (
          SELECT min(head.seq) FROM {{.Messages}} head
          WHERE head.aggregate_type = c.aggregate_type AND head.aggregate_id = c.aggregate_id
            AND head.published_at IS NULL AND head.dead_at IS NULL)
    ORDER BY c.seq
    LIMIT $1
), locked AS (
    SELECT l.id, l.seq, l.aggregate_type, l.aggregate_id
    FROM {{.Messages}} l
    WHERE l.id = ANY (ARRAY(SELECT id FROM candidate))
      AND l.published_at IS NULL AND l.dead_at IS NULL AND NOT l.waiting
    FOR UPDATE SKIP LOCKED
)
UPDATE {{.Messages}} m SET waiting = true
FROM locked l
WHERE m.id = l.id
  AND EXISTS (
      SELECT 1 FROM {{.Messages}} older
      WHERE older.aggregate_type = l.aggregate_type AND older.aggregate_id = l.aggregate_id
        AND older.published_at IS NULL AND older.dead_at IS NULL AND older.seq < l.seq
      FOR KEY SHARE SKIP LOCKED)`

// repairWaiting makes every aggregate's oldest pending row claimable. releaseNext already
// does it as heads go; this is the safety net for rows changed by hand (an operator marking a
// row dead in SQL, say), run now and then. It reads the whole backlog.
const repairWaiting = `
UPDATE {{.Messages}} m SET waiting = false
FROM (
    SELECT DISTINCT ON (aggregate_type, aggregate_id) id, waiting
    FROM {{.Messages}}
    WHERE published_at IS NULL AND dead_at IS NULL
    ORDER BY aggregate_type, aggregate_id, seq) head
WHERE m.id = head.id AND head.waiting`

// PublishBatch runs one relay cycle, as [Relay.Run] does in a loop: claim a batch of due
// rows, publish them, mark the outcome, commit. It returns how many rows it claimed. Once
// rows are claimed the cycle finishes even if ctx is cancelled; if the process dies, or hangs
// past [Config].ClaimTimeout, the rows are pending again, and those the broker had are
// published a second time (at least once).
func (r *Relay) PublishBatch(ctx context.Context) (int, error) {
	c, err := r.cycle(ctx)
	return c.claimed, err
}

// cycleResult is what one cycle did, for Run's pacing. With several batches in flight it
// sums the batches that ended during one step of the pipeline.
type cycleResult struct {
	// claimed counts the rows of the batches that ended.
	claimed int
	// settled counts rows whose fate was decided: published, or an attempt counted.
	settled int
	// last is how many rows the step's claim took.
	last int
	// more is set when the step's claim was full and its batch is still in flight: the
	// relay claims again at once.
	more bool
}

func (c *cycleResult) add(o cycleResult) {
	c.claimed += o.claimed
	c.settled += o.settled
}

// batch is one claimed batch on its way through the relay: claimed in a transaction of its
// own, published, marked and committed in it.
type batch struct {
	tx         pgx.Tx
	ctx        context.Context // bounded in time; not cancelled when Run's ctx is
	cancel     context.CancelFunc
	msgs       []Message
	unreadable map[int]error
	// publishBy is the publish's deadline: PublishTimeout after the claim.
	publishBy time.Time

	// sent is closed once the batch's publish returned, or was given up; brokerDown is set
	// before, when the broker was found unavailable. The next batch of the pipeline waits
	// for it, so that batches are sent in the order they were claimed, and none is sent
	// to a broker that the batch before it found unavailable.
	sent       chan struct{}
	sentOnce   sync.Once
	brokerDown error
}

// endSend records the outcome of the batch's publish for the batch after it.
func (b *batch) endSend(brokerDown error) {
	b.sentOnce.Do(func() {
		b.brokerDown = brokerDown
		close(b.sent)
	})
}

// release rolls back the batch's transaction (a no-op after its commit) and frees its
// context.
func (b *batch) release() {
	_ = b.tx.Rollback(context.WithoutCancel(b.ctx))
	b.cancel()
	b.endSend(nil)
}

// cycle is the serial relay's cycle, and PublishBatch's: claim a batch, then finish it.
func (r *Relay) cycle(ctx context.Context) (cycleResult, error) {
	b, err := r.claimNext(ctx)
	if err != nil || b == nil {
		return cycleResult{}, err
	}
	res, err := r.finish(b, nil)
	res.last = res.claimed
	return res, err
}

// claimNext claims the next batch in a transaction of its own. It returns nil, and no
// error, when no row is due.
func (r *Relay) claimNext(ctx context.Context) (_ *batch, err error) {
	if !r.maint.inRun.Load() && !r.lane { // Run maintains on a goroutine of its own
		r.maint.maybeRun(ctx)
	}

	// Until rows are claimed, cancelling ctx may abort the cycle: nothing is held yet.
	claimCtx, cancelClaim := context.WithTimeout(ctx, r.cfg.ClaimTimeout)
	defer cancelClaim()
	// After that, the batch runs to its end on a context of its own, bounded in time: the
	// publish by PublishTimeout, each statement by ClaimTimeout.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout+2*r.cfg.ClaimTimeout)

	tx, err := r.db.Begin(claimCtx)
	if err != nil {
		cancel()
		return nil, databaseError{fmt.Errorf("claim outbox batch: begin: %w", err)}
	}
	b := &batch{tx: tx, ctx: bctx, cancel: cancel, sent: make(chan struct{})}
	handedOver := false
	defer func() {
		if !handedOver { // nothing claimed, a failure, or a panicking hook
			b.release()
		}
	}()

	var srv server
	b.msgs, b.unreadable, srv, err = r.claim(claimCtx, tx)
	if err != nil {
		return nil, databaseError{fmt.Errorf("claim outbox batch: %w", err)}
	}
	if h := r.cfg.Hooks.Polled; h != nil {
		r.hook(func() { h(Poll{Claimed: len(b.msgs)}) })
	}
	if len(b.msgs) == 0 {
		return nil, nil
	}
	if srv.synchronous {
		if err := r.awaitReplication(claimCtx, tx, srv); err != nil {
			return nil, databaseError{fmt.Errorf("claim outbox batch: wait until the claimed rows are on the synchronous standbys: %w", err)}
		}
	}
	b.publishBy = time.Now().Add(r.cfg.PublishTimeout)
	handedOver = true
	return b, nil
}

// finish publishes a claimed batch, after prev (the batch claimed before it, still in
// flight; nil if none) was sent, then marks the outcome and commits. It releases b whatever
// happens. Its phases: send, settle (the decisions, pure), report, mark, commit.
func (r *Relay) finish(b *batch, prev *batch) (res cycleResult, err error) {
	defer b.release()
	ctx, msgs := b.ctx, b.msgs
	res.claimed = len(msgs)

	spans := r.startSpans(ctx, msgs, time.Now())
	var confirmedAt time.Time
	defer func() { spans.end(confirmedAt, err) }()

	outcomes, answeredAt, sent := r.send(b, prev, spans)
	confirmedAt = answeredAt
	if sent && r.lane {
		r.failpoint(FailpointLaneAfterPublish)
	} else if sent {
		r.failpoint(FailpointAfterPublish)
	}

	s := settle(msgs, outcomes, r.rowStreaks.of(msgs), r.rules)
	r.rowStreaks.set(msgs, s.streaks)
	result := s.result
	result.ConfirmedAt = confirmedAt
	result.PublishedSpans = r.report(ctx, msgs, &s, spans)
	res.settled = s.settled()

	if err := r.mark(ctx, b.tx, &s.marks); err != nil {
		return res, err
	}
	r.failpoint(FailpointAfterMark)
	if err := b.tx.Commit(ctx); err != nil {
		// The broker has the confirmed messages; they will be published again.
		return res, databaseError{fmt.Errorf("commit outbox batch: %w", err)}
	}
	if h := r.cfg.Hooks.BatchDone; h != nil {
		r.hook(func() { h(result) })
	}
	if s.unavailable != nil {
		return res, brokerError{fmt.Errorf("publish outbox batch: %w", s.unavailable)}
	}
	return res, nil
}

// send publishes b's messages once prev allows it (see waitForPrevious), and tells the
// batch after b whether the broker was found unavailable. It returns one outcome per
// message, when the answers came, and whether the batch went to the publisher at all: a
// batch that may not be sent has, for each message, the error that says why (wrapping
// [ErrUnavailable]: no attempt is counted).
func (r *Relay) send(b, prev *batch, spans *batchSpans) (outcomes []error, answeredAt time.Time, sent bool) {
	if skip := r.waitForPrevious(b, prev); skip != nil {
		outcomes = make([]error, len(b.msgs))
		for i := range outcomes {
			outcomes[i] = skip
		}
		b.endSend(skip)
		return outcomes, time.Now(), false
	}
	outcomes = r.publish(b.ctx, b.publishBy, b.msgs, b.unreadable, spans)
	answeredAt = time.Now()
	b.endSend(firstUnavailable(outcomes))
	return outcomes, answeredAt, true
}

// firstUnavailable returns the first of outcomes that found the broker unavailable, or nil.
func firstUnavailable(outcomes []error) error {
	for _, err := range outcomes {
		if errors.Is(err, ErrUnavailable) {
			return err
		}
	}
	return nil
}

// report tells what settle decided for msgs: each publish span's outcome, a log line for
// each failed row (and, at debug level, each refused one), and the refusals' streak, which
// says the broker's refusals once per streak rather than once per row. It returns the span
// contexts of the published rows, for [BatchResult].PublishedSpans.
func (r *Relay) report(ctx context.Context, msgs []Message, s *settlement, spans *batchSpans) []trace.SpanContext {
	var scs []trace.SpanContext
	published := 0
	for i, f := range s.fates {
		m := msgs[i]
		spans.outcome(i, f.outcome, f.err)
		switch f.outcome {
		case OutcomePublished:
			published++
			scs = spans.appendSampled(scs, i, published)
		case OutcomeDeferred:
			r.cfg.Logger.DebugContext(ctx, "outbox message refused by the broker; will retry without counting an attempt",
				"message_id", m.ID, "message_type", m.Type, "aggregate_id", m.AggregateID, "error", f.err)
		case OutcomeFailed, OutcomeDead:
			logFailure(ctx, r.cfg, m, f.err, f.outcome == OutcomeDead)
		}
	}
	if s.refused != nil {
		// Each refused row waits its own retry delay: the streak only logs. It ends in
		// endRefusals.
		r.lastRefusal.Store(time.Now().UnixNano())
		r.refusals.Fail(ctx, s.refused)
	}
	if len(s.marks.published) > 0 {
		r.lastAccepted.Store(time.Now().UnixNano())
	}
	return scs
}

// mark runs the statements that record a batch's marks in its claim transaction tx: the
// rows published, failed and deferred, then releaseNext for the aggregates whose head is no
// longer pending (it must run after the marks). A head that releaseNext could not release,
// because another transaction holds it, is left to the maintenance's repair, which it asks
// for at once.
func (r *Relay) mark(ctx context.Context, tx pgx.Tx, m *marks) error {
	if len(m.published) > 0 {
		if _, err := r.markConfirmed(ctx, tx, m.published); err != nil {
			return databaseError{fmt.Errorf("mark %d outbox rows published: %w", len(m.published), err)}
		}
	}
	if f := &m.failed; len(f.ids) > 0 {
		if _, err := tx.Exec(ctx, r.sql.markFailed, f.ids, f.errs, f.delays, f.dead); err != nil {
			return databaseError{fmt.Errorf("mark %d outbox rows failed: %w", len(f.ids), err)}
		}
	}
	if d := &m.deferred; len(d.ids) > 0 {
		if _, err := tx.Exec(ctx, r.sql.markDeferred, d.ids, d.errs, d.delays); err != nil {
			return databaseError{fmt.Errorf("defer %d outbox rows: %w", len(d.ids), err)}
		}
	}
	if len(m.doneTypes) > 0 {
		var heads, released int
		if err := tx.QueryRow(ctx, r.sql.releaseNext, m.doneTypes, m.doneIDs).Scan(&heads, &released); err != nil {
			return databaseError{fmt.Errorf("release the next rows of %d aggregates: %w", len(m.doneTypes), err)}
		}
		if released < heads {
			r.maint.requestRepair()
		}
	}
	return nil
}

// publish sends the messages that can be sent, within deadline, and returns one outcome per
// message.
// spans gives the headers to send (the message's, with its publish span's trace context).
func (r *Relay) publish(ctx context.Context, deadline time.Time, msgs []Message, unreadable map[int]error, spans *batchSpans) []error {
	outcomes := make([]error, len(msgs))
	send := make([]Message, 0, len(msgs))
	index := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if err := unreadable[i]; err != nil {
			outcomes[i] = Permanent(err)
			continue
		}
		if len(m.Payload) > r.cfg.MaxMessageBytes {
			outcomes[i] = Permanent(fmt.Errorf("%w: payload of %d bytes exceeds MaxMessageBytes %d", ErrTooLarge, len(m.Payload), r.cfg.MaxMessageBytes))
			continue
		}
		m.Headers = spans.sendHeaders(i, m)
		send = append(send, m)
		index = append(index, i)
	}
	r.failpoint(FailpointBeforePublish)
	if len(send) == 0 {
		return outcomes
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	spans.sent(time.Now())
	errs := r.pub.Publish(pctx, send)
	if len(errs) != len(send) {
		// A broken Publisher: trust none of its answers.
		err := fmt.Errorf("%w: publisher returned %d results for %d messages", ErrUnavailable, len(errs), len(send))
		for _, i := range index {
			outcomes[i] = err
		}
		return outcomes
	}
	for j, i := range index {
		outcomes[i] = errs[j]
	}
	return outcomes
}

// claim locks and reads a batch. A row whose headers are not a JSON object of strings (written
// by hand, say) is returned in unreadable, so that it ends dead instead of failing every claim.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx) (msgs []Message, unreadable map[int]error, srv server, err error) {
	ms := strconv.FormatInt(r.cfg.ClaimTimeout.Milliseconds(), 10)
	var ignored string
	var deletes string
	if r.cfg.DeletePublished {
		deletes = r.cfg.Tables.sqlNames().MessagesText
	}
	var mayDelete bool
	if err := tx.QueryRow(ctx, claimSettings, ms, ms, deletes).Scan(&ignored, &ignored, &ignored, &srv.synchronous, &srv.started, &mayDelete); err != nil {
		return nil, nil, srv, fmt.Errorf("set timeouts: %w", err)
	}
	if !mayDelete {
		return nil, nil, srv, fmt.Errorf("%w (GRANT DELETE ON %s TO the relay's role)", errNoDelete, deletes)
	}
	rows, err := tx.Query(ctx, r.claimSQL, r.cfg.BatchSize)
	if err != nil {
		return nil, nil, srv, err
	}
	defer rows.Close()
	msgs = make([]Message, 0, r.cfg.BatchSize)
	for rows.Next() {
		var (
			m       Message
			payload []byte
			headers []byte
		)
		if err := rows.Scan(&m.ID, &m.Exchange, &m.RoutingKey, &m.Type, &m.AggregateType, &m.AggregateID,
			&payload, &headers, &m.CreatedAt, &m.Attempts); err != nil {
			return nil, nil, srv, err
		}
		m.Payload = payload
		if len(headers) > 2 { // "{}" is the common case
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				if unreadable == nil {
					unreadable = map[int]error{}
				}
				unreadable[len(msgs)] = fmt.Errorf("headers are not a JSON object of strings: %w", err)
			}
		}
		msgs = append(msgs, m)
	}
	return msgs, unreadable, srv, rows.Err()
}

// server is what a claim learnt of the server it ran on.
type server struct {
	synchronous bool      // synchronous_standby_names is set
	started     time.Time // pg_postmaster_start_time(): tells one server from another
}

// awaitReplication returns once the rows claimed in claim, on srv, are on its synchronous
// standbys, so that a failover cannot take back a row the relay has published. The claim
// only reads them, and a row committed on the primary alone is visible there all the same:
// its writer's wait for the standby was cut short (its backend cancelled), or the primary
// crashed and replayed it at restart. (A commit still waiting for the standby is not
// visible: the claim cannot see it.) The claim transaction stays open until the rows are
// published, so its own commit cannot wait for them; a transaction of its own, on another
// connection, does (see replicationBarrier): it began after the claim saw the rows, so its
// commit record comes after theirs in the WAL, and the standby has them once it has that
// record. Then a statement on the claim transaction proves that the claim's session is still
// alive, so that the barrier ran on the same server in the same life (a crash-restart or a
// failover in between ends the session, and the relay publishes nothing); it also resets
// the claim's idle_in_transaction_session_timeout, which must cover the publish alone. The
// barrier's server start time must be the claim's too: a connection the pool opened to
// another server in between would prove nothing.
//
// It waits at most until ctx ends: with a single synchronous standby that is down, the
// relay reports the database unavailable and backs off, holding nothing meanwhile. The
// barrier needs a connection of the pool besides the claim's: on a server with synchronous
// standbys a pool of one connection stalls (see [PoolSize]).
func (r *Relay) awaitReplication(ctx context.Context, claim pgx.Tx, srv server) error {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer rollback(ctx, tx)
	var emitted *string // the logical message's LSN: NULL if it was not written
	var ignored string
	var started time.Time
	if err := tx.QueryRow(ctx, replicationBarrier).Scan(&emitted, &ignored, &started); err != nil {
		return err
	}
	if !started.Equal(srv.started) {
		return fmt.Errorf("the barrier ran on another server (started %s) than the claim (started %s): a failover", started, srv.started)
	}
	if emitted == nil { // synchronous_standby_names was emptied since the claim
		return errors.New("the server has no synchronous standby any more: the barrier would wait for nothing")
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w (%w)", ErrCommitUnknown, err)
	}
	if _, err := claim.Exec(ctx, confirmClaim); err != nil {
		return fmt.Errorf("the claim's session after the barrier: %w", err)
	}
	return nil
}

// confirmClaim is what the claim transaction runs after the barrier: anything that reaches
// the server.
const confirmClaim = `SELECT 1`

func logFailure(ctx context.Context, cfg Config, m Message, err error, dead bool) {
	attrs := []any{"message_id", m.ID, "message_type", m.Type, "aggregate_id", m.AggregateID,
		"attempts", m.Attempts + 1, "error", err}
	if dead {
		cfg.Logger.ErrorContext(ctx, "outbox message is dead; it will not be retried", attrs...)
		return
	}
	cfg.Logger.WarnContext(ctx, "outbox publish failed; will retry", attrs...)
}

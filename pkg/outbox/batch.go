package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimBatch locks up to $1 due rows, oldest first, skipping rows another relay holds.
//
// Only the oldest pending row of each aggregate qualifies (the scalar subquery): a row waits
// until every older pending row of its aggregate is published or dead. Together with SKIP
// LOCKED this keeps per-aggregate order across any number of relays: while one relay holds
// the head row of an aggregate, the others skip it, and the next row does not qualify because
// the head is still pending in their snapshot.
//
// The check is written as "seq = (SELECT min(seq) …)" rather than NOT EXISTS on purpose: the
// planner cannot turn a scalar subquery into a join, so it always walks the pending index in
// seq order and probes one index entry per candidate, stopping at the LIMIT. NOT EXISTS let it
// pick an anti join that scanned the whole backlog for every row on a freshly filled table
// (100x slower before the first ANALYZE).
//
// The claim keeps no cursor ("published up to seq N"). A row whose seq is smaller than rows
// already published but whose transaction committed later is simply pending, and the next
// claim takes it: nothing is ever skipped for good.
const claimBatch = `
SELECT o.id, o.exchange, o.routing_key, o.type, o.aggregate_type, o.aggregate_id,
       o.payload, o.headers, o.created_at, o.attempts
FROM outbox_messages o
WHERE o.published_at IS NULL AND o.dead_at IS NULL AND o.next_attempt_at <= now()
  AND o.seq = (
      SELECT min(head.seq) FROM outbox_messages head
      WHERE head.aggregate_type = o.aggregate_type AND head.aggregate_id = o.aggregate_id
        AND head.published_at IS NULL AND head.dead_at IS NULL)
ORDER BY o.seq
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`

// markPublished marks exactly the confirmed rows.
const markPublished = `
UPDATE outbox_messages SET published_at = now() WHERE id = ANY($1::uuid[])`

// markFailed counts an attempt against each failed row, schedules its retry, and buries the
// rows that gave up.
const markFailed = `
UPDATE outbox_messages o
SET attempts        = o.attempts + 1,
    last_error      = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    dead_at         = CASE WHEN f.dead THEN now() END
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[]) AS f(id, error, delay_ms, dead)
WHERE o.id = f.id`

// PublishBatch runs one relay cycle: claim a batch of due rows, publish them, mark the
// outcome, commit. It returns how many rows it claimed. [Relay.Run] calls it in a loop;
// tests and benchmarks may call it directly.
//
// Once the rows are claimed the cycle finishes even if ctx is cancelled, so a stopping relay
// leaves no row half-done. If the process dies anywhere in the cycle, the transaction rolls
// back: every claimed row is pending again, and rows the broker had already confirmed are
// published a second time (at-least-once; the inbox absorbs the duplicate).
func (r *Relay) PublishBatch(ctx context.Context) (int, error) {
	// Until rows are claimed, cancelling ctx may abort the cycle: nothing is held yet.
	claimCtx, cancelClaim := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancelClaim()
	// After that, the cycle runs to its end on a context of its own, bounded in time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout+30*time.Second)
	defer cancel()

	tx, err := r.pool.Begin(claimCtx)
	if err != nil {
		return 0, databaseError{fmt.Errorf("claim outbox batch: begin: %w", err)}
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	msgs, unreadable, err := claim(claimCtx, tx, r.cfg.BatchSize)
	if err != nil {
		return 0, databaseError{fmt.Errorf("claim outbox batch: %w", err)}
	}
	if h := r.cfg.Hooks.Polled; h != nil {
		h(ctx, len(msgs))
	}
	if len(msgs) == 0 {
		return 0, nil
	}

	outcomes := r.publish(ctx, msgs, unreadable)
	confirmedAt := time.Now()
	r.failpoint(FailpointAfterPublish)

	var (
		result    = BatchResult{ConfirmedAt: confirmedAt}
		published []string
		failed    struct {
			ids, errs []string
			delays    []int64
			dead      []bool
		}
		unavailable error
	)
	for i, err := range outcomes {
		m := msgs[i]
		switch {
		case err == nil:
			published = append(published, m.ID.String())
			result.Published = append(result.Published, m)
		case errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotSent):
			// Not the message's fault: no attempt is counted.
			result.Untouched++
			if unavailable == nil && errors.Is(err, ErrUnavailable) {
				unavailable = err
			}
		default:
			dead := IsPermanent(err) || m.Attempts+1 >= r.cfg.MaxAttempts
			failed.ids = append(failed.ids, m.ID.String())
			failed.errs = append(failed.errs, err.Error())
			failed.delays = append(failed.delays, backoff(m.Attempts+1, r.cfg.RetryBaseDelay, r.cfg.RetryMaxDelay).Milliseconds())
			failed.dead = append(failed.dead, dead)
			result.Failed = append(result.Failed, Failure{Message: m, Err: err, Dead: dead})
			logFailure(ctx, r.cfg, m, err, dead)
		}
	}

	if len(published) > 0 {
		if _, err := tx.Exec(ctx, markPublished, published); err != nil {
			return len(msgs), databaseError{fmt.Errorf("mark %d outbox rows published: %w", len(published), err)}
		}
	}
	if len(failed.ids) > 0 {
		if _, err := tx.Exec(ctx, markFailed, failed.ids, failed.errs, failed.delays, failed.dead); err != nil {
			return len(msgs), databaseError{fmt.Errorf("mark %d outbox rows failed: %w", len(failed.ids), err)}
		}
	}
	r.failpoint(FailpointAfterMark)
	if err := tx.Commit(ctx); err != nil {
		// The broker has the confirmed messages; they will be published again.
		return len(msgs), databaseError{fmt.Errorf("commit outbox batch: %w", err)}
	}
	if h := r.cfg.Hooks.BatchDone; h != nil {
		h(ctx, result)
	}
	if unavailable != nil {
		return len(msgs), brokerError{fmt.Errorf("publish outbox batch: %w", unavailable)}
	}
	return len(msgs), nil
}

// publish sends the messages that can be sent and returns one outcome per message.
func (r *Relay) publish(ctx context.Context, msgs []Message, unreadable map[int]error) []error {
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
		send = append(send, m)
		index = append(index, i)
	}
	r.failpoint(FailpointBeforePublish)
	if len(send) == 0 {
		return outcomes
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
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

// claim reads the claimed rows. A row whose headers are not a JSON object of strings (written
// by hand, say) is returned in unreadable, so that it ends dead instead of failing every claim.
func claim(ctx context.Context, tx pgx.Tx, limit int) (msgs []Message, unreadable map[int]error, err error) {
	rows, err := tx.Query(ctx, claimBatch, limit)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	msgs = make([]Message, 0, limit)
	for rows.Next() {
		var (
			m       Message
			payload []byte
			headers []byte
		)
		if err := rows.Scan(&m.ID, &m.Exchange, &m.RoutingKey, &m.Type, &m.AggregateType, &m.AggregateID,
			&payload, &headers, &m.CreatedAt, &m.Attempts); err != nil {
			return nil, nil, err
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
	return msgs, unreadable, rows.Err()
}

func logFailure(ctx context.Context, cfg Config, m Message, err error, dead bool) {
	attrs := []any{"message_id", m.ID, "message_type", m.Type, "aggregate_id", m.AggregateID,
		"attempts", m.Attempts + 1, "error", err}
	if dead {
		cfg.Logger.ErrorContext(ctx, "outbox message is dead; it will not be retried", attrs...)
		return
	}
	cfg.Logger.WarnContext(ctx, "outbox publish failed; will retry", attrs...)
}

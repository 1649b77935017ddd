package outbox

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// maxNotSentStreak is how many cycles in a row a row may come back [ErrNotSent] before the
// relay counts an attempt against it: a publisher that never sends one message, whatever the
// reason, must not hold its aggregate for ever.
const maxNotSentStreak = 5

// settleRules are what settle needs of the relay's [Config].
type settleRules struct {
	// maxAttempts is [Config].MaxAttempts: the failed attempts that make a row dead.
	maxAttempts int
	// retryDelay is the wait after a row's n-th failed attempt, or its n-th refusal in a row
	// (n from 1): the retry backoff of RetryBaseDelay and RetryMaxDelay, with jitter, so
	// that many rows do not retry in step.
	retryDelay func(n int) time.Duration
}

// settlement is settle's decision on a batch: what became of each row, the statements that
// record it, and what the relay learns of the broker.
type settlement struct {
	// fates holds what became of each row, in the batch's order.
	fates []fate
	// marks are the arguments of the statements that record the fates (see [Relay.mark]).
	marks marks
	// result is the batch's outcome for [Hooks].BatchDone, but for ConfirmedAt and
	// PublishedSpans, which the caller fills in.
	result BatchResult
	// streaks are the rows' streaks after this cycle, in the batch's order: how many cycles
	// in a row each came back unsent or refused, this one included; 0 ends a row's streak.
	streaks []int
	// unavailable is the first answer that found the broker unavailable: the batch ends
	// with it, and the relay pauses.
	unavailable error
	// refused is the first refusal of the batch, with its message's id, for the refusals'
	// streak.
	refused error
}

// fate is what settle decided for one row.
type fate struct {
	// outcome is one of OutcomePublished, OutcomeUntouched, OutcomeDeferred, OutcomeFailed
	// and OutcomeDead.
	outcome string
	// err is the publisher's answer, or what the row is charged with when a run of
	// ErrNotSent costs it an attempt; nil for a published row.
	err error
}

// marks are the arguments of the statements that record a batch's fates in its claim
// transaction. The slices of each group are in step with its ids.
type marks struct {
	// published are the rows to mark published (markPublished).
	published []pgtype.UUID
	// failed are the rows that count an attempt (markFailed): due again after delays
	// (milliseconds), or dead.
	failed struct {
		ids    []pgtype.UUID
		errs   []string
		delays []int64
		dead   []bool
	}
	// deferred are the rows due again after delays (milliseconds), no attempt counted
	// (markDeferred).
	deferred struct {
		ids    []pgtype.UUID
		errs   []string
		delays []int64
	}
	// doneTypes and doneIDs name the aggregates whose head this batch published or buried:
	// releaseNext makes their next row claimable.
	doneTypes, doneIDs []string
}

// settled counts the rows whose fate the batch decided: published, or an attempt counted.
// Rows left untouched or deferred are not settled.
func (s *settlement) settled() int {
	return len(s.marks.published) + len(s.marks.failed.ids)
}

// settle decides what becomes of each row of a batch: msgs, with the publisher's answer for
// each in outcomes (nil: confirmed) and each row's streak before this cycle in streaks. It is
// where the guarantees of README.md#guarantees are decided: every failure is blamed on the
// message, the broker or the database, and only the message's own fault costs an attempt.
//
//   - A confirmed row is published, and the next row of its aggregate released.
//   - [ErrUnavailable] is the broker's fault: the row is untouched, and the batch ends with
//     the outage (settlement.unavailable), which pauses the relay.
//   - [ErrNotSent] leaves the row untouched, until the maxNotSentStreak-th time in a row:
//     that one is charged an attempt, and the row's streak ends.
//   - [ErrRefused] (the broker's own reasons) defers the row by the retry backoff of its
//     streak of refusals, with no attempt counted.
//   - Any other answer counts an attempt: the row is due again after the retry backoff of
//     its attempts, or dead when the error is [Permanent] or the attempts reach maxAttempts.
//     A dead row releases the next row of its aggregate, as a published one does.
func settle(msgs []Message, outcomes []error, streaks []int, rules settleRules) settlement {
	s := settlement{fates: make([]fate, len(msgs)), streaks: make([]int, len(msgs))}
	for i, m := range msgs {
		err := outcomes[i]
		streak := nextStreak(streaks[i], err)
		s.streaks[i] = streak
		switch {
		case err == nil:
			s.publish(i, m)
			continue
		case errors.Is(err, ErrUnavailable):
			// The broker, not the message: no attempt is counted, and the relay pauses.
			s.leave(i, err)
			if s.unavailable == nil {
				s.unavailable = err
			}
			continue
		case errors.Is(err, ErrNotSent) && streak < maxNotSentStreak:
			// Not sent through no fault of its own: as it was, for the next cycle.
			s.leave(i, err)
			continue
		case errors.Is(err, ErrRefused):
			s.postpone(i, m, err, rules.retryDelay(streak))
			continue
		case errors.Is(err, ErrNotSent):
			err = fmt.Errorf("not sent %d times in a row: %w", streak, err)
			s.streaks[i] = 0
		}
		s.fail(i, m, err, rules)
	}
	return s
}

// nextStreak is a row's streak after a cycle that answered err, from its streak before.
// Only ErrNotSent and ErrRefused continue a streak; anything else ends it.
func nextStreak(before int, err error) int {
	if !errors.Is(err, ErrUnavailable) && (errors.Is(err, ErrNotSent) || errors.Is(err, ErrRefused)) {
		return before + 1
	}
	return 0
}

// publish, leave and postpone record the fate of row i, m: published, untouched, deferred.
func (s *settlement) publish(i int, m Message) {
	s.fates[i] = fate{outcome: OutcomePublished}
	s.marks.published = append(s.marks.published, pgUUID(m.ID))
	s.marks.done(m)
	s.result.Published = append(s.result.Published, m)
}

func (s *settlement) leave(i int, err error) {
	s.fates[i] = fate{outcome: OutcomeUntouched, err: err}
	s.result.Untouched++
}

func (s *settlement) postpone(i int, m Message, err error, delay time.Duration) {
	s.fates[i] = fate{outcome: OutcomeDeferred, err: err}
	s.marks.deferred.ids = append(s.marks.deferred.ids, pgUUID(m.ID))
	s.marks.deferred.errs = append(s.marks.deferred.errs, err.Error())
	s.marks.deferred.delays = append(s.marks.deferred.delays, delay.Milliseconds())
	s.result.Deferred++
	if s.refused == nil {
		s.refused = fmt.Errorf("message %s: %w", m.ID, err)
	}
}

// fail counts an attempt against the row: it is dead once err is permanent or its attempts
// reach maxAttempts, else due again after the retry backoff of its attempts.
func (s *settlement) fail(i int, m Message, err error, rules settleRules) {
	permanent := IsPermanent(err)
	dead := permanent || m.Attempts+1 >= rules.maxAttempts
	lastError := err.Error()
	if permanent {
		lastError = "permanent: " + lastError
	}
	f := &s.marks.failed
	f.ids = append(f.ids, pgUUID(m.ID))
	f.errs = append(f.errs, lastError)
	f.delays = append(f.delays, rules.retryDelay(m.Attempts+1).Milliseconds())
	f.dead = append(f.dead, dead)
	s.result.Failed = append(s.result.Failed, Failure{Message: m, Err: err, Dead: dead})
	if dead {
		s.fates[i] = fate{outcome: OutcomeDead, err: err}
		s.marks.done(m)
		return
	}
	s.fates[i] = fate{outcome: OutcomeFailed, err: err}
}

// done records that m's aggregate has a new head: m is no longer pending.
func (mk *marks) done(m Message) {
	mk.doneTypes = append(mk.doneTypes, m.AggregateType)
	mk.doneIDs = append(mk.doneIDs, m.AggregateID)
}

// rowStreaks holds, per row, how many cycles in a row the publisher left it unsent or the
// broker refused it: settle's streaks, kept from one cycle to the next. Batches in flight
// hold disjoint rows, so reading a batch's streaks and storing them after settle loses no
// count.
type rowStreaks struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

// of returns the streaks of msgs, in their order.
func (rs *rowStreaks) of(msgs []Message) []int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]int, len(msgs))
	for i, m := range msgs {
		out[i] = rs.n[m.ID]
	}
	return out
}

// set stores the streaks of msgs, in their order; 0 forgets a row.
func (rs *rowStreaks) set(msgs []Message, streaks []int) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i, m := range msgs {
		if streaks[i] == 0 {
			delete(rs.n, m.ID)
			continue
		}
		if rs.n == nil || len(rs.n) > 100_000 { // rows another relay finished stay here
			rs.n = map[uuid.UUID]int{}
		}
		rs.n[m.ID] = streaks[i]
	}
}

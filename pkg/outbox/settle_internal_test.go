package outbox

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestSettle holds settle to the rules of blame of README.md#guarantees,
// row by row: what each answer of the publisher makes of a row (its outcome, the error it
// is charged with, its last_error, its retry delay, whether it is dead, its streak after the
// cycle, whether its aggregate's next row is released), and what the batch tells the relay
// (the outage it ends with, its first refusal, how many rows it settled).
func TestSettle(t *testing.T) {
	t.Parallel()
	// A retry delay without jitter: the n-th delay is n minutes, so a row's delay names the
	// step of the backoff settle chose.
	rules := settleRules{maxAttempts: 3, retryDelay: func(n int) time.Duration { return time.Duration(n) * time.Minute }}
	var (
		unavailable  = fmt.Errorf("%w: connection closed", ErrUnavailable)
		unavailable2 = fmt.Errorf("%w: blocked", ErrUnavailable)
		notSent      = fmt.Errorf("publisher skipped it: %w", ErrNotSent)
		refused      = fmt.Errorf("%w: queue full", ErrRefused)
		unroutable   = fmt.Errorf("%w: no route", ErrUnroutable)
		permanent    = Permanent(errors.New("bad content"))
	)
	// row is one row of a case: its state before the cycle and the publisher's answer, then
	// what settle must decide.
	type row struct {
		attempts, streak int
		answer           error

		outcome   string
		charged   string        // fate.err, as text; "" for none
		lastError string        // failed, dead and deferred rows: the last_error written
		delay     time.Duration // failed and deferred rows: the wait before the row is due
		after     int           // the row's streak after the cycle
		released  bool          // its aggregate's next row is released
	}
	for _, tc := range []struct {
		name        string
		rows        []row
		settled     int
		unavailable error // the error the batch ends with
		refused     int   // index of the first refused row; -1: none
	}{
		{name: "EmptyBatch", refused: -1},
		{
			name: "ConfirmedRowsArePublished",
			rows: []row{
				{answer: nil, outcome: OutcomePublished, released: true},
				{attempts: 2, streak: 3, answer: nil, outcome: OutcomePublished, released: true},
			},
			settled: 2, refused: -1,
		},
		{
			name: "AnOutageCostsNoAttemptAndEndsTheBatch",
			rows: []row{
				{answer: nil, outcome: OutcomePublished, released: true},
				{attempts: 2, answer: unavailable, outcome: OutcomeUntouched, charged: unavailable.Error()},
				{streak: 3, answer: unavailable2, outcome: OutcomeUntouched, charged: unavailable2.Error()},
			},
			settled: 1, unavailable: unavailable, refused: -1,
		},
		{
			name: "NotSentIsLeftAsItWasUntilItsStreakIsLong",
			rows: []row{
				{answer: notSent, outcome: OutcomeUntouched, charged: notSent.Error(), after: 1},
				{streak: maxNotSentStreak - 2, answer: notSent, outcome: OutcomeUntouched, charged: notSent.Error(), after: maxNotSentStreak - 1},
			},
			refused: -1,
		},
		{
			name: "NotSentTheFifthTimeInARowCostsAnAttempt",
			rows: []row{
				{
					streak: maxNotSentStreak - 1, answer: notSent, outcome: OutcomeFailed,
					charged:   "not sent 5 times in a row: " + notSent.Error(),
					lastError: "not sent 5 times in a row: " + notSent.Error(), delay: time.Minute,
				},
				{
					attempts: 2, streak: maxNotSentStreak - 1, answer: notSent, outcome: OutcomeDead,
					charged:   "not sent 5 times in a row: " + notSent.Error(),
					lastError: "not sent 5 times in a row: " + notSent.Error(), delay: 3 * time.Minute, released: true,
				},
			},
			settled: 2, refused: -1,
		},
		{
			name: "RefusedRowsAreDeferredByTheirStreakWithoutAnAttempt",
			rows: []row{
				{answer: nil, outcome: OutcomePublished, released: true},
				{attempts: 2, answer: refused, outcome: OutcomeDeferred, charged: refused.Error(), lastError: refused.Error(), delay: time.Minute, after: 1},
				{streak: 2, answer: refused, outcome: OutcomeDeferred, charged: refused.Error(), lastError: refused.Error(), delay: 3 * time.Minute, after: 3},
			},
			settled: 1, refused: 1,
		},
		{
			name: "TheMessagesFaultCostsAnAttemptUntilMaxAttempts",
			rows: []row{
				{answer: unroutable, outcome: OutcomeFailed, charged: unroutable.Error(), lastError: unroutable.Error(), delay: time.Minute},
				{attempts: 1, streak: 2, answer: unroutable, outcome: OutcomeFailed, charged: unroutable.Error(), lastError: unroutable.Error(), delay: 2 * time.Minute},
				{attempts: 2, answer: unroutable, outcome: OutcomeDead, charged: unroutable.Error(), lastError: unroutable.Error(), delay: 3 * time.Minute, released: true},
			},
			settled: 3, refused: -1,
		},
		{
			name: "APermanentFailureIsDeadAtOnce",
			rows: []row{
				{answer: permanent, outcome: OutcomeDead, charged: permanent.Error(), lastError: "permanent: " + permanent.Error(), delay: time.Minute, released: true},
			},
			settled: 1, refused: -1,
		},
		{
			name: "EachRowAlone",
			rows: []row{
				{answer: refused, outcome: OutcomeDeferred, charged: refused.Error(), lastError: refused.Error(), delay: time.Minute, after: 1},
				{answer: unavailable, outcome: OutcomeUntouched, charged: unavailable.Error()},
				{answer: nil, outcome: OutcomePublished, released: true},
				{answer: notSent, outcome: OutcomeUntouched, charged: notSent.Error(), after: 1},
				{answer: permanent, outcome: OutcomeDead, charged: permanent.Error(), lastError: "permanent: " + permanent.Error(), delay: time.Minute, released: true},
				{attempts: 1, answer: unroutable, outcome: OutcomeFailed, charged: unroutable.Error(), lastError: unroutable.Error(), delay: 2 * time.Minute},
				{answer: refused, outcome: OutcomeDeferred, charged: refused.Error(), lastError: refused.Error(), delay: time.Minute, after: 1},
			},
			settled: 3, unavailable: unavailable, refused: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msgs := make([]Message, len(tc.rows))
			outcomes := make([]error, len(tc.rows))
			streaks := make([]int, len(tc.rows))
			for i, r := range tc.rows {
				msgs[i] = Message{ID: uuid.New(), Type: "T", AggregateType: "order", AggregateID: fmt.Sprint("a-", i), Attempts: r.attempts}
				outcomes[i], streaks[i] = r.answer, r.streak
			}

			s := settle(msgs, outcomes, streaks, rules)

			var (
				want       marks
				wantResult BatchResult
				failures   []string
			)
			for i, r := range tc.rows {
				m, id := msgs[i], pgUUID(msgs[i].ID)
				require.Equal(t, r.outcome, s.fates[i].outcome, "row %d's outcome", i)
				if r.charged == "" {
					require.NoError(t, s.fates[i].err, "row %d is charged with nothing", i)
				} else {
					require.EqualError(t, s.fates[i].err, r.charged, "row %d's error", i)
				}
				require.Equal(t, r.after, s.streaks[i], "row %d's streak after the cycle", i)
				switch r.outcome {
				case OutcomePublished:
					want.published = append(want.published, id)
					wantResult.Published = append(wantResult.Published, m)
				case OutcomeUntouched:
					wantResult.Untouched++
				case OutcomeDeferred:
					want.deferred.ids = append(want.deferred.ids, id)
					want.deferred.errs = append(want.deferred.errs, r.lastError)
					want.deferred.delays = append(want.deferred.delays, r.delay.Milliseconds())
					wantResult.Deferred++
				case OutcomeFailed, OutcomeDead:
					dead := r.outcome == OutcomeDead
					want.failed.ids = append(want.failed.ids, id)
					want.failed.errs = append(want.failed.errs, r.lastError)
					want.failed.delays = append(want.failed.delays, r.delay.Milliseconds())
					want.failed.dead = append(want.failed.dead, dead)
					failures = append(failures, fmt.Sprintf("%s dead=%t: %s", m.ID, dead, r.charged))
				}
				if r.released {
					want.doneTypes = append(want.doneTypes, m.AggregateType)
					want.doneIDs = append(want.doneIDs, m.AggregateID)
				}
			}
			require.Equal(t, want, s.marks, "the marks")
			require.Equal(t, tc.settled, s.settled())

			var gotFailures []string
			for _, f := range s.result.Failed {
				gotFailures = append(gotFailures, fmt.Sprintf("%s dead=%t: %v", f.Message.ID, f.Dead, f.Err))
			}
			require.Equal(t, failures, gotFailures, "BatchResult.Failed")
			s.result.Failed = nil
			require.Equal(t, wantResult, s.result, "the rest of the BatchResult")

			require.Equal(t, tc.unavailable, s.unavailable, "the outage the batch ends with: the first")
			if tc.refused < 0 {
				require.NoError(t, s.refused)
			} else {
				require.EqualError(t, s.refused, fmt.Sprintf("message %s: %s", msgs[tc.refused].ID, refused))
				require.ErrorIs(t, s.refused, ErrRefused)
			}
		})
	}
}

// TestNextStreak: only ErrNotSent and ErrRefused continue a row's streak.
func TestNextStreak(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		answer error
		want   int
	}{
		{nil, 0},
		{fmt.Errorf("x: %w", ErrNotSent), 3},
		{fmt.Errorf("x: %w", ErrRefused), 3},
		{fmt.Errorf("x: %w", ErrUnavailable), 0},
		{errors.Join(ErrUnavailable, ErrNotSent), 0}, // the broker is away: no streak of the row's
		{fmt.Errorf("x: %w", ErrUnroutable), 0},
		{Permanent(errors.New("bad")), 0},
	} {
		require.Equal(t, tc.want, nextStreak(2, tc.answer), "%v", tc.answer)
	}
}

// TestRowStreaks: the streaks settle returns are those the next cycle reads; 0 forgets a row.
func TestRowStreaks(t *testing.T) {
	t.Parallel()
	var rs rowStreaks
	a, b := Message{ID: uuid.New()}, Message{ID: uuid.New()}
	require.Equal(t, []int{0, 0}, rs.of([]Message{a, b}))
	rs.set([]Message{a, b}, []int{1, 4})
	require.Equal(t, []int{1, 4}, rs.of([]Message{a, b}))
	rs.set([]Message{b}, []int{0})
	require.Equal(t, []int{1, 0}, rs.of([]Message{a, b}))
	require.Len(t, rs.n, 1, "a row whose streak ended is forgotten")
}

// TestFirstUnavailable: the batch after one tells the broker unavailable by its first such
// answer.
func TestFirstUnavailable(t *testing.T) {
	t.Parallel()
	down1, down2 := fmt.Errorf("%w: one", ErrUnavailable), fmt.Errorf("%w: two", ErrUnavailable)
	for _, tc := range []struct {
		outcomes []error
		want     error
	}{
		{nil, nil},
		{[]error{nil, ErrNotSent, ErrRefused, Permanent(errors.New("bad"))}, nil},
		{[]error{nil, down1, down2}, down1},
		{[]error{down2, nil, down1}, down2},
	} {
		require.Equal(t, tc.want, firstUnavailable(tc.outcomes))
	}
}

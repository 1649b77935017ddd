package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPacer plays sequences of cycles through Run's pacer and holds each pause to the
// README.md#wake-ups: full batches claim again at once, a cycle that found
// rows or that a notification started is re-checked NotifyRecheck later, then less and less
// often until the poll takes over; an outage and a cycle that sent nothing back off, and no
// notification cuts that short.
func TestPacer(t *testing.T) {
	t.Parallel()
	const (
		batchSize = 10
		poll      = time.Second
		recheck   = 10 * time.Millisecond
	)
	var (
		now    = pause{now: true}
		outage = pause{outage: true}
	)
	wait := func(d time.Duration) pause { return pause{wait: d, wakeable: true} }
	// The n-th idle backoff, without jitter: n tenths of a second.
	idle := func(n int) pause { return pause{wait: time.Duration(n) * 100 * time.Millisecond} }

	// cycle is one cycle and the pause it must be followed by; woken: a notification then
	// ends that pause.
	type cycle struct {
		c      cycleResult
		failed bool
		want   pause
		woken  bool
	}
	var (
		empty   = cycleResult{}
		found   = cycleResult{claimed: 3, settled: 3, last: 3}
		full    = cycleResult{claimed: batchSize, settled: batchSize, last: batchSize}
		more    = cycleResult{last: batchSize, more: true}
		nothing = cycleResult{claimed: 3, last: 3} // claimed, none sent
	)
	for _, tc := range []struct {
		name          string
		notifyRecheck time.Duration
		cycles        []cycle
	}{
		{name: "AnEmptyPollWaitsThePollInterval", cycles: []cycle{
			{c: empty, want: wait(poll)},
			{c: empty, want: wait(poll)},
		}},
		{name: "FoundRowsAreRecheckedLessAndLessOftenUntilThePoll", cycles: []cycle{
			{c: found, want: wait(recheck)},
			{c: found, want: wait(recheck)}, // a re-check that finds rows is followed by another
			{c: empty, want: wait(2 * recheck)},
			{c: empty, want: wait(4 * recheck)},
			{c: empty, want: wait(8 * recheck)},
			{c: empty, want: wait(16 * recheck)},
			{c: empty, want: wait(32 * recheck)},
			{c: empty, want: wait(64 * recheck)},
			{c: empty, want: wait(poll)}, // 1.28s would exceed the poll: polling takes over
			{c: empty, want: wait(poll)},
		}},
		{name: "ANotifiedCycleIsRechecked", cycles: []cycle{
			{c: empty, want: wait(poll), woken: true},
			{c: empty, want: wait(recheck)},
			{c: empty, want: wait(2 * recheck)},
		}},
		{name: "AClaimThatTookRowsIsRecheckedThoughNoneEnded", cycles: []cycle{
			{c: cycleResult{last: 3}, want: wait(recheck)},
		}},
		{name: "FullBatchesClaimAgainAtOnce", cycles: []cycle{
			{c: more, want: now},
			{c: full, want: now},
			{c: cycleResult{claimed: 2 * batchSize, settled: 2 * batchSize, last: 4}, want: wait(recheck)},
		}},
		{name: "ANotificationCountsUntilTheNextPause", cycles: []cycle{
			{c: empty, want: wait(poll), woken: true},
			{c: full, want: now},
			{c: empty, want: wait(recheck)}, // the notified run of cycles ended empty
			{c: empty, want: wait(2 * recheck)},
		}},
		{name: "ANotificationCountsUntilTheNextPausePipelined", cycles: []cycle{
			{c: empty, want: wait(poll), woken: true},
			{c: more, want: now},
			{c: empty, want: wait(recheck)},
		}},
		{name: "ACycleThatSentNothingBacksOff", cycles: []cycle{
			{c: nothing, want: idle(1)},
			{c: nothing, want: idle(2)},
			{c: nothing, want: idle(3)},
			{c: found, want: wait(recheck)}, // sent again: the backoff is over
			{c: nothing, want: idle(1)},
		}},
		{name: "ACycleThatSentNothingDropsTheRecheck", cycles: []cycle{
			{c: found, want: wait(recheck)},
			{c: empty, want: wait(2 * recheck)},
			{c: nothing, want: idle(1)},
			{c: empty, want: wait(poll)},
		}},
		{name: "AnOutageBacksOffAndDropsTheRecheck", cycles: []cycle{
			{c: found, want: wait(recheck)},
			{failed: true, want: outage},
			{failed: true, want: outage},
			{c: empty, want: wait(poll)},
		}},
		{name: "AnOutageKeepsTheCountOfCyclesThatSentNothing", cycles: []cycle{
			{c: nothing, want: idle(1)},
			{failed: true, want: outage},
			{c: nothing, want: idle(2)},
		}},
		{name: "AFailedCycleWithAFullBatchIsAnOutage", cycles: []cycle{
			{c: more, failed: true, want: outage},
		}},
		{name: "NoRecheckAtThePollInterval", notifyRecheck: poll, cycles: []cycle{
			{c: found, want: wait(poll), woken: true},
			{c: empty, want: wait(poll)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &pacer{
				batchSize: batchSize, pollInterval: poll, notifyRecheck: recheck,
				idleBackoff: func(n int) time.Duration { return idle(n).wait },
			}
			if tc.notifyRecheck != 0 {
				p.notifyRecheck = tc.notifyRecheck
			}
			for i, c := range tc.cycles {
				require.Equal(t, c.want, p.after(c.c, c.failed), "the pause after cycle %d", i)
				if c.woken {
					require.True(t, c.want.wakeable, "case error: cycle %d's pause cannot be woken", i)
					p.woken()
				}
			}
		})
	}
}

package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMaintSchedule holds the maintenance's schedule to what maintenance says of it: a pass
// once per PollInterval, at once after a full pass or when a cycle asked for a repair, none
// during a failed pass's backoff whatever asks for one; and repairWaiting with every
// repairEvery-th pass.
func TestMaintSchedule(t *testing.T) {
	t.Parallel()
	const every = time.Second
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		sched       maintSchedule
		at          time.Duration // now, after t0
		repairAsked bool
		due         bool
		wait        time.Duration
	}{
		{name: "TheFirstPass", sched: maintSchedule{}, due: true, wait: every},
		{name: "BeforeThePollInterval", sched: maintSchedule{last: t0}, at: every - time.Millisecond, wait: every},
		{name: "AtThePollInterval", sched: maintSchedule{last: t0}, at: every, due: true, wait: every},
		{name: "AfterAFullPass", sched: maintSchedule{last: t0, more: true}, at: time.Millisecond, due: true, wait: 0},
		{name: "ARepairAsked", sched: maintSchedule{last: t0}, at: time.Millisecond, repairAsked: true, due: true, wait: 0},
		{
			name:  "DuringAFailedPassesBackoff",
			sched: maintSchedule{last: t0, more: true, after: t0.Add(3 * every)}, at: 2 * every, repairAsked: true,
			wait: every,
		},
		{
			name:  "AtTheEndOfTheBackoff",
			sched: maintSchedule{last: t0, after: t0.Add(3 * every)}, at: 3 * every,
			due: true, wait: every,
		},
		{
			name:  "ABackoffShorterThanThePollInterval",
			sched: maintSchedule{last: t0, after: t0.Add(every / 10)}, at: every / 10,
			wait: every,
		},
		{
			name:  "ARepairAskedAfterTheBackoff",
			sched: maintSchedule{last: t0, after: t0.Add(every / 10)}, at: every / 10, repairAsked: true,
			due: true, wait: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.sched.every = every
			now := t0.Add(tc.at)
			require.Equal(t, tc.due, tc.sched.due(now, tc.repairAsked), "due")
			require.Equal(t, tc.wait, tc.sched.wait(now, tc.repairAsked), "wait")
		})
	}

	t.Run("Repairs", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			passes int
			asked  bool
			want   bool
		}{
			{1, false, false},
			{1, true, true},
			{repairEvery - 1, false, false},
			{repairEvery, false, true},
			{repairEvery + 1, false, false},
			{2 * repairEvery, false, true},
		} {
			s := maintSchedule{every: every, passes: tc.passes}
			require.Equal(t, tc.want, s.repairs(tc.asked), "pass %d, asked %t", tc.passes, tc.asked)
		}
	})
}

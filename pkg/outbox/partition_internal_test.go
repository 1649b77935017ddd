package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMissingPartitions: the ranges Cleanup makes follow the grid, start at the current
// partition, stop once past now+ahead, and are cut where partitions already cover part of
// them (made by hand, or with another length).
func TestMissingPartitions(t *testing.T) {
	t.Parallel()
	at := func(hm string) time.Time {
		v, err := time.Parse("15:04", hm)
		require.NoError(t, err)
		return time.Date(2026, 12, 5, v.Hour(), v.Minute(), 0, 0, time.UTC)
	}
	part := func(from, to string) partition {
		lo, hi := at(from), at(to)
		return partition{name: from, lower: &lo, upper: &hi}
	}
	ranges := func(rs [][2]time.Time) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r[0].Format("15:04")+"-"+r[1].Format("15:04"))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		now   string
		ahead time.Duration
		every time.Duration
		parts []partition
		want  []string
	}{
		{"none yet", "10:20", 2 * time.Hour, time.Hour, nil, []string{"10:00-11:00", "11:00-12:00", "12:00-13:00"}},
		{"on a boundary", "10:00", time.Hour, time.Hour, nil, []string{"10:00-11:00"}},
		{"some made", "10:20", 2 * time.Hour, time.Hour, []partition{part("10:00", "11:00"), part("11:00", "12:00")}, []string{"12:00-13:00"}},
		{"all made", "10:20", 2 * time.Hour, time.Hour, []partition{part("09:00", "10:00"), part("10:00", "13:00")}, nil},
		{"one made by hand across the grid", "10:20", 2 * time.Hour, time.Hour, []partition{part("10:30", "11:30")}, []string{"10:00-10:30", "11:30-12:00", "12:00-13:00"}},
		{"a longer length before", "10:20", time.Hour, 15 * time.Minute, []partition{part("00:00", "10:40")}, []string{"10:40-10:45", "10:45-11:00", "11:00-11:15", "11:15-11:30"}},
		{"a gap behind the last one is not filled", "10:20", time.Hour, time.Hour, []partition{part("07:00", "08:00")}, []string{"10:00-11:00", "11:00-12:00"}},
		{"bounds that are not timestamps are passed over", "10:20", time.Hour, time.Hour, []partition{{name: "default"}}, []string{"10:00-11:00", "11:00-12:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ranges(missingPartitions(at(tc.now), tc.ahead, tc.every, tc.parts)))
		})
	}
}

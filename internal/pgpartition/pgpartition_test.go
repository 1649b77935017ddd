package pgpartition

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMissing: the ranges Create makes follow the grid, start at the current
// partition, stop once past now+ahead, and are cut where partitions already cover part of
// them (made by hand, or with another length).
func TestMissing(t *testing.T) {
	t.Parallel()
	at := func(hm string) time.Time {
		v, err := time.Parse("15:04", hm)
		require.NoError(t, err)
		return time.Date(2026, 12, 5, v.Hour(), v.Minute(), 0, 0, time.UTC)
	}
	part := func(from, to string) Partition {
		lo, hi := at(from), at(to)
		return Partition{Name: from, Lower: &lo, Upper: &hi}
	}
	ranges := func(rs [][2]time.Time) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r[0].Format("15:04")+"-"+r[1].Format("15:04"))
		}
		return out
	}
	ptr := func(t time.Time) *time.Time { return &t }
	for _, tc := range []struct {
		name  string
		now   string
		ahead time.Duration
		every time.Duration
		parts []Partition
		want  []string
	}{
		{"none yet", "10:20", 2 * time.Hour, time.Hour, nil, []string{"10:00-11:00", "11:00-12:00", "12:00-13:00"}},
		{"on a boundary", "10:00", time.Hour, time.Hour, nil, []string{"10:00-11:00"}},
		{"some made", "10:20", 2 * time.Hour, time.Hour, []Partition{part("10:00", "11:00"), part("11:00", "12:00")}, []string{"12:00-13:00"}},
		{"all made", "10:20", 2 * time.Hour, time.Hour, []Partition{part("09:00", "10:00"), part("10:00", "13:00")}, nil},
		{"one made by hand across the grid", "10:20", 2 * time.Hour, time.Hour, []Partition{part("10:30", "11:30")}, []string{"10:00-10:30", "11:30-12:00", "12:00-13:00"}},
		{"a longer length before", "10:20", time.Hour, 15 * time.Minute, []Partition{part("00:00", "10:40")}, []string{"10:40-10:45", "10:45-11:00", "11:00-11:15", "11:15-11:30"}},
		{"a gap behind the last one is not filled", "10:20", time.Hour, time.Hour, []Partition{part("07:00", "08:00")}, []string{"10:00-11:00", "11:00-12:00"}},
		{"a DEFAULT partition is passed over", "10:20", time.Hour, time.Hour, []Partition{{Name: "default"}}, []string{"10:00-11:00", "11:00-12:00"}},
		{"MINVALUE covers what is before its end", "10:20", time.Hour, time.Hour, []Partition{{Name: "min", Upper: ptr(at("10:30"))}}, []string{"10:30-11:00", "11:00-12:00"}},
		{"MAXVALUE covers the rest", "10:20", 2 * time.Hour, time.Hour, []Partition{{Name: "max", Lower: ptr(at("11:00"))}}, []string{"10:00-11:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ranges(Missing(at(tc.now), tc.ahead, tc.every, tc.parts)))
		})
	}
}

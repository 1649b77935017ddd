package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const exposition = `# HELP inbox_duplicates_total Deliveries skipped because the message was already processed.
# TYPE inbox_duplicates_total counter
inbox_duplicates_total{consumer="warehouse",service="warehouse",type="OrderCreated"} 3
inbox_duplicates_total{consumer="warehouse",service="warehouse",type="OrderCancelled"} 1
inbox_duplicates_total{consumer="warehouse",service="warehouse",type="other"} 0
inbox_duplicates_total_created{consumer="warehouse"} 1.7e+09
inbox_duplicates_totalx 99
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76444519781e+09
weird_labels{path="a}b"} 5
`

func TestSumMetric(t *testing.T) {
	t.Parallel()

	t.Run("SumsEverySeriesOfTheFamilyOnly", func(t *testing.T) {
		t.Parallel()
		v, ok := sumMetric(exposition, metricDuplicates)
		require.True(t, ok)
		require.Equal(t, 4.0, v)
	})

	t.Run("WithoutLabels", func(t *testing.T) {
		t.Parallel()
		v, ok := sumMetric(exposition, metricStartTime)
		require.True(t, ok)
		require.Equal(t, 1.76444519781e+09, v)
	})

	t.Run("BraceInsideALabelValue", func(t *testing.T) {
		t.Parallel()
		v, ok := sumMetric(exposition, "weird_labels")
		require.True(t, ok)
		require.Equal(t, 5.0, v)
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		_, ok := sumMetric(exposition, "inbox_messages_processed_total")
		require.False(t, ok)
		_, ok = sumMetric("", metricDuplicates)
		require.False(t, ok)
	})
}

func TestIncarnationSum(t *testing.T) {
	t.Parallel()

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		var s incarnationSum
		total, seen := s.Total()
		require.Zero(t, total)
		require.False(t, seen)
		_, seen = s.ServiceTotal("warehouse")
		require.False(t, seen)
	})

	t.Run("ARestartCountsFromZeroAgain", func(t *testing.T) {
		t.Parallel()
		var s incarnationSum
		// The first warehouse process absorbed 5 duplicates, then died.
		s.Observe("warehouse", 100, 2)
		s.Observe("warehouse", 100, 5)
		// Its restart starts from 0 and absorbs 3 more.
		s.Observe("warehouse", 160, 0)
		s.Observe("warehouse", 160, 3)
		s.Observe("orders-api", 90, 1)

		w, seen := s.ServiceTotal("warehouse")
		require.True(t, seen)
		require.Equal(t, 8.0, w)
		total, _ := s.Total()
		require.Equal(t, 9.0, total)
		require.Equal(t, 2, s.Incarnations("warehouse"))
	})

	t.Run("AStaleScrapeDoesNotLowerTheCount", func(t *testing.T) {
		t.Parallel()
		var s incarnationSum
		s.Observe("warehouse", 100, 5)
		s.Observe("warehouse", 100, 4) // an older answer arriving late
		w, _ := s.ServiceTotal("warehouse")
		require.Equal(t, 5.0, w)
	})
}

package service_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/service"
)

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("DeclaredWithTheServiceLabelAndTheirSeries", func(t *testing.T) {
		t.Parallel()
		p := service.NewProcess("kit", "all", service.Options{})
		m := service.NewMetrics(p)
		created := m.Counter("kit_created_total", "Things created.")
		results := m.CounterVec("kit_results_total", "Results.", "result", "ok", "failed")
		levels := m.GaugeVec("kit_level", "Levels.", "sku")
		require.NoError(t, m.Err())

		created.Inc()
		levels.WithLabelValues("A").Set(3)
		require.Equal(t, 1.0, testutil.ToFloat64(created))
		require.Equal(t, 2, testutil.CollectAndCount(results), "both series from the start")
		require.Zero(t, testutil.ToFloat64(results.WithLabelValues("failed")))
		families, err := p.Registry.Gather()
		require.NoError(t, err)
		seen := 0
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == "service" {
						require.Equal(t, "kit", l.GetValue(), f.GetName())
						seen++
					}
				}
			}
		}
		require.Equal(t, 4, seen, "created, two results and one level carry service=\"kit\"")
	})

	t.Run("ErrIsTheFirstFailedRegistration", func(t *testing.T) {
		t.Parallel()
		p := service.NewProcess("kit", "all", service.Options{})
		m := service.NewMetrics(p)
		m.Counter("kit_twice_total", "Declared twice.")
		second := m.Counter("kit_twice_total", "Declared twice.")
		require.NotNil(t, second)
		require.ErrorContains(t, m.Err(), "register kit_twice_total")
	})
}

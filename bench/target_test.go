package bench_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		check bench.Check
		want  string
	}{
		{"AtLeastMet", bench.AtLeast(0.65, 0.60, "≥ 60% of A"), "✓ ≥ 60% of A"},
		{"AtLeastOnTheLineIsMet", bench.AtLeast(10, 10, "≥ 10× peer"), "✓ ≥ 10× peer"},
		{"AtLeastMissed", bench.AtLeast(0.43, 0.60, "≥ 60% of A"), "✗ ≥ 60% of A"},
		{"AtMostMet", bench.AtMost(9e6, 10e6, "p99 ≤ 10 ms"), "✓ p99 ≤ 10 ms"},
		{"AtMostMissed", bench.AtMost(1.76, 1.2, "claim within 20%"), "✗ claim within 20%"},
		{"MissingFigureIsNotMeasured", bench.AtLeast(math.NaN(), 10, "≥ 10× peer"), "? ≥ 10× peer (not measured)"},
		{"MissingLimitIsNotMeasured", bench.AtMost(3, math.NaN(), "≤ 40 MiB"), "? ≤ 40 MiB (not measured)"},
		{"NoTarget", bench.Check{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.check.String())
		})
	}
}

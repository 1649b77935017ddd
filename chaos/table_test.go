package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTable(t *testing.T) {
	t.Parallel()

	outcomes := []Outcome{
		{
			Scenario: "relay-after-publish", Placed: 320, Acknowledged: 318,
			Statuses:            map[string]int{"RESERVED": 180, "REJECTED": 100, "CANCELLED": 38, "CANCELLING": 1},
			DuplicatesPublished: 3, DuplicatesAbsorbed: 3, Stall: 2040 * time.Millisecond, Recovery: 6150 * time.Millisecond,
			LogBurst: LogBurst{Service: OrdersRelay, Lines: 12},
		},
		{Scenario: "poison", Placed: 5, Acknowledged: 5, Lost: 1, DoubleApplied: 2, Failures: []string{"1 acknowledged orders lost"}},
	}
	got := Table(outcomes)
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	require.Len(t, lines, 4, "header, separator, one row per outcome")

	t.Run("Header", func(t *testing.T) {
		t.Parallel()
		for _, h := range tableHeader {
			require.Contains(t, lines[0], h)
		}
		require.Regexp(t, `^\|[ \-:|]+\|$`, lines[1])
	})

	t.Run("Rows", func(t *testing.T) {
		t.Parallel()
		cells := splitRow(lines[2])
		require.Equal(t, []string{"relay-after-publish", "320 / 318", "180 / 100 / 38", "3 / 3", "0", "0", "2.0s", "6.2s", "orders-relay 12", "**PASS**"}, cells)
		cells = splitRow(lines[3])
		require.Equal(t, []string{"poison", "5 / 5", "0 / 0 / 0", "0 / 0", "1", "2", "–", "–", "–", "**FAIL**"}, cells)
	})

	t.Run("ColumnsLineUp", func(t *testing.T) {
		t.Parallel()
		for _, l := range lines[1:] {
			require.Equal(t, len([]rune(lines[0])), len([]rune(l)), "every line as wide as the header: %q", l)
		}
		// Numbers are right-aligned: the separator says so, and so does the padding.
		require.Contains(t, lines[1], "-: |")
		require.Regexp(t, `\|\s+320 / 318 \|`, lines[2])
	})

	t.Run("Details", func(t *testing.T) {
		t.Parallel()
		d := Details([]Outcome{{
			Scenario: "network", Elapsed: 12 * time.Second,
			Injected: []string{"network cut"}, Seen: []string{"4 connections dropped"}, Failures: []string{"nothing healed"},
		}})
		require.Contains(t, d, "### network — FAIL (12.0s)")
		require.Contains(t, d, "- injected: network cut\n")
		require.Contains(t, d, "- seen: 4 connections dropped\n")
		require.Contains(t, d, "- **FAIL**: nothing healed\n")
	})
}

func splitRow(line string) []string {
	parts := strings.Split(strings.Trim(line, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func TestOutcomeResult(t *testing.T) {
	t.Parallel()
	require.Equal(t, "PASS", Outcome{}.Result())
	require.True(t, Outcome{}.Passed())
	require.Equal(t, "FAIL", Outcome{Failures: []string{"x"}}.Result())
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	require.Equal(t, "–", formatDuration(0))
	require.Equal(t, "0.1s", formatDuration(149*time.Millisecond))
	require.Equal(t, "23.5s", formatDuration(23500*time.Millisecond))
}

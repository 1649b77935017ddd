package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Outcome is what one scenario did and saw.
type Outcome struct {
	Scenario string
	// Placed counts the orders the load generator attempted; Acknowledged those answered 201.
	Placed, Acknowledged int
	// Statuses counts the orders per final status (RESERVED, REJECTED, CANCELLED) at the end.
	Statuses map[string]int
	// DuplicatesPublished counts events the relays published more than once (deliveries to
	// the observer queue minus distinct message ids).
	DuplicatesPublished int
	// DuplicatesAbsorbed counts deliveries the consumers' inboxes skipped as already
	// processed; AbsorbedFrom says how they were counted ("metrics", "logs", or both).
	DuplicatesAbsorbed int
	AbsorbedFrom       string
	// Lost counts acknowledged orders that are missing or never reached a final status.
	Lost int
	// DoubleApplied counts effects applied more than once.
	DoubleApplied int
	// Stall is the longest time during the load in which no order completed (got the
	// warehouse's first answer): how long the fault stopped the shop, as its users saw it.
	Stall time.Duration
	// Recovery is the time from the fault to the moment every invariant held again (0 when
	// there was no fault or the shop never drained).
	Recovery time.Duration
	// LogBurst is the busiest second of warnings and errors of any of the shop's processes
	// (Lines 0 when none logged one).
	LogBurst LogBurst
	// Elapsed is the scenario's whole running time.
	Elapsed time.Duration
	// Injected says what the fault was and when; Seen what the runner observed.
	Injected, Seen []string
	// Failures are the reasons of a FAIL; none means PASS.
	Failures []string
	// Logs holds the tail of each service's output, kept for a failed scenario.
	Logs map[Service]string
}

// Passed reports whether the scenario passed.
func (o Outcome) Passed() bool { return len(o.Failures) == 0 }

// Result is "PASS" or "FAIL".
func (o Outcome) Result() string {
	if o.Passed() {
		return "PASS"
	}
	return "FAIL"
}

// tableHeader is the header of the summary table.
var tableHeader = []string{
	"scenario", "orders placed / acked", "RESERVED / REJECTED / CANCELLED",
	"duplicates published / absorbed", "lost", "double-applied", "longest stall", "time to recover",
	"busiest second (warn+error)", "result",
}

// Table renders outcomes as a Markdown table, one row per scenario.
func Table(outcomes []Outcome) string {
	rows := [][]string{tableHeader}
	for _, o := range outcomes {
		rows = append(rows, []string{
			o.Scenario,
			fmt.Sprintf("%d / %d", o.Placed, o.Acknowledged),
			fmt.Sprintf("%d / %d / %d", o.Statuses["RESERVED"], o.Statuses["REJECTED"], o.Statuses["CANCELLED"]),
			fmt.Sprintf("%d / %d", o.DuplicatesPublished, o.DuplicatesAbsorbed),
			fmt.Sprint(o.Lost),
			fmt.Sprint(o.DoubleApplied),
			formatDuration(o.Stall),
			formatDuration(o.Recovery),
			formatBurst(o.LogBurst),
			"**" + o.Result() + "**",
		})
	}
	widths := make([]int, len(tableHeader))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	// Numbers are aligned to the right, in the source as in the rendered table.
	numeric := func(i int) bool { return i > 0 && i < len(widths)-1 }
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if numeric(i) {
				b.WriteString(" " + pad + c + " |")
			} else {
				b.WriteString(" " + c + pad + " |")
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	sep := make([]string, len(widths))
	for i, w := range widths {
		sep[i] = strings.Repeat("-", w)
		if numeric(i) {
			sep[i] = strings.Repeat("-", w-1) + ":"
		}
	}
	line(sep)
	for _, r := range rows[1:] {
		line(r)
	}
	return b.String()
}

// Details renders, per scenario, what was injected, what was seen and why it failed.
func Details(outcomes []Outcome) string {
	var b strings.Builder
	for _, o := range outcomes {
		fmt.Fprintf(&b, "### %s — %s (%s)\n\n", o.Scenario, o.Result(), formatDuration(o.Elapsed))
		for _, s := range o.Injected {
			fmt.Fprintf(&b, "- injected: %s\n", s)
		}
		for _, s := range o.Seen {
			fmt.Fprintf(&b, "- seen: %s\n", s)
		}
		for _, s := range o.Failures {
			fmt.Fprintf(&b, "- **FAIL**: %s\n", s)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// formatBurst prints a busiest second as "orders-relay 12", "–" for none.
func formatBurst(b LogBurst) string {
	if b.Lines == 0 {
		return "–"
	}
	return fmt.Sprintf("%s %d", b.Service, b.Lines)
}

// formatDuration prints d to a tenth of a second, "–" for zero.
func formatDuration(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// plural writes a count with its noun, or the phrase that starts with it, in the number
// the count takes: plural(1, "retry", "retries") is "1 retry", 0 and 2 take "retries".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// formatCounts writes counts by name sorted by name, "CANCELLED=3, RESERVED=17", or "none".
func formatCounts(counts map[string]int) string {
	if len(counts) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(counts))
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

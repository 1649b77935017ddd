package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Row is one line of the result table.
type Row struct {
	// Item names the measurement: "A" and "B" for the limits, "3"…"8" for the brief's items.
	Item string
	// What says what was measured, with its parameters.
	What string
	// Result is the absolute figure.
	Result string
	// Ratio compares Result with a limit or the peer measured in the same run.
	Ratio string
	// Target is a [Check] rendered with its mark, or empty.
	Target string
	// CPU is the CPU time per 1,000 messages of the processes taking part ([FormatCPU]),
	// or empty.
	CPU string
}

// Table is the result of a run: one Markdown table.
type Table struct {
	Rows []Row
}

// Add appends a row.
func (t *Table) Add(r Row) { t.Rows = append(t.Rows, r) }

var tableHeader = Row{Item: "#", What: "measurement", Result: "result", Ratio: "ratio (same run)", Target: "target", CPU: "CPU per 1,000 msgs"}

// Markdown renders the table with its columns padded, so that it reads in a terminal as well
// as rendered. A "|" inside a cell is escaped.
func (t Table) Markdown() string {
	rows := append([]Row{tableHeader}, t.Rows...)
	cells := make([][6]string, len(rows))
	var width [6]int
	for i, r := range rows {
		cells[i] = [6]string{r.Item, r.What, r.Result, r.Ratio, r.Target, r.CPU}
		for j, c := range cells[i] {
			c = strings.ReplaceAll(c, "|", `\|`)
			cells[i][j] = c
			width[j] = max(width[j], utf8.RuneCountInString(c), 1)
		}
	}
	var b strings.Builder
	line := func(cols [6]string) {
		b.WriteString("|")
		for j, c := range cols {
			b.WriteString(" ")
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", width[j]-utf8.RuneCountInString(c)))
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	line(cells[0])
	var sep [6]string
	for j := range sep {
		sep[j] = strings.Repeat("-", width[j])
	}
	line(sep)
	for _, c := range cells[1:] {
		line(c)
	}
	return b.String()
}

// FormatRate renders a throughput with thousands separators: "12,345 msg/s", or with one
// decimal below 100: "85.3 tx/s". A rate that is not a finite positive number is "—".
func FormatRate(v float64, unit string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return "—"
	}
	if v = math.Round(v*10) / 10; v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
	}
	return groupThousands(int64(math.Round(v))) + " " + unit
}

func groupThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// FormatCount renders a whole number with thousands separators: "200,000".
func FormatCount(n int) string { return groupThousands(int64(n)) }

// FormatLatency renders a duration with three significant digits in µs, ms or s:
// "850 µs", "2.14 ms", "21.4 ms", "214 ms", "1.23 s".
func FormatLatency(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	units := []struct {
		name string
		size time.Duration
	}{{"µs", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}}
	for i, u := range units {
		v := round3(float64(d) / float64(u.size))
		if v < 1000 || i == len(units)-1 {
			return sig3(v) + " " + u.name
		}
	}
	panic("unreachable")
}

// sig3 formats v (≥ 0) with three significant digits, without exponent.
func sig3(v float64) string {
	v = round3(v) // first, so that 9.996 is "10.0", not "10.00"
	switch {
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// round3 rounds v to three significant digits.
func round3(v float64) float64 {
	if v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return v
	}
	scale := math.Pow(10, 2-math.Floor(math.Log10(v)))
	return math.Round(v*scale) / scale
}

// FormatLatencies renders p50, p99 and p99.9 on one line.
func FormatLatencies(l Latencies) string {
	if l.N == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s · p99 %s · p99.9 %s", FormatLatency(l.P50), FormatLatency(l.P99), FormatLatency(l.P999))
}

// FormatPercent renders a ratio as a whole percentage: 0.654 → "65%".
func FormatPercent(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "—"
	}
	return strconv.FormatFloat(math.Round(r*100), 'f', 0, 64) + "%"
}

// FormatTimes renders a ratio as a multiple: 11.43 → "11.4×", 142.6 → "143×".
func FormatTimes(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 {
		return "—"
	}
	return sig3(r) + "×"
}

// FormatMiB renders bytes in MiB with one decimal: "23.4 MiB".
func FormatMiB(bytes int64) string {
	return strconv.FormatFloat(float64(bytes)/(1<<20), 'f', 1, 64) + " MiB"
}

// Ratio returns a/b, or NaN when either is not a positive finite number, so that a
// measurement that failed renders as "—" rather than as 0% or +Inf.
func Ratio(a, b float64) float64 {
	if !(a > 0) || !(b > 0) || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return math.NaN()
	}
	return a / b
}

package loadgen

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Kinds of [Result.Errors].
const (
	kindConnection  = "connection"  // the request could not be sent or its answer was cut off
	kindTimeout     = "timeout"     // no answer within the client's timeout
	kindHTTP4xx     = "http_4xx"    // a 4xx that the request did not deserve
	kindHTTP5xx     = "http_5xx"    // a 5xx, after RetryFor ran out
	kindMismatch    = "mismatch"    // a duplicate's answer was not a replay of the first answer
	kindUnexpected  = "unexpected"  // an answer outside the API: another status, no order id, an unknown SKU accepted
	kindInterrupted = "interrupted" // abandoned after a stop, when the grace for in-flight orders ran out
)

// Percentiles of a latency distribution (see the histogram for the precision).
type Percentiles struct {
	P50, P95, P99, Max time.Duration
}

// Result is what a run did. Errors holds only what went wrong; expected refusals (RejectedByAPI,
// a cancellation answered 409 because the warehouse rejected the order first) are not errors.
type Result struct {
	Placed        int               // orders attempted
	Acknowledged  map[string]string // Idempotency-Key → order id, for every order that got a 201 (first answer or replay)
	Cancelled     int               // cancellations answered 200
	Duplicates    int               // deliberate duplicate submissions sent
	Replays       int               // answers marked Idempotent-Replayed: true
	Retries       int               // retries after errors (RetryFor)
	Errors        map[string]int    // by kind: "connection", "timeout", "http_4xx", "http_5xx", "mismatch", "unexpected", "interrupted"
	RejectedByAPI int               // 422 answers for UnknownSKUFraction orders (expected)
	Latency       Percentiles       // of POST /orders answered 201 (each exchange on its own, replays included)
	Elapsed       time.Duration

	// What Summary tells besides the above.
	rate            float64
	concurrency     int
	seed            uint64
	keyPrefix       string
	due             int               // orders due by the schedule while placing (Rate > 0)
	behind          bool              // due − Placed exceeded the backlog a healthy run can have
	cancelConflicts int               // cancellations answered 409: the order was already REJECTED
	latencyCount    uint64            // answers in Latency
	examples        map[string]string // one error message per kind
}

// Summary is a few human-readable lines about the run, ending with a newline.
func (r Result) Summary() string {
	var b strings.Builder
	secs := r.Elapsed.Seconds()
	achieved := 0.0
	if secs > 0 {
		achieved = float64(r.Placed) / secs
	}
	target := "unpaced"
	if r.rate > 0 {
		target = fmt.Sprintf("target %s/s", fmtRate(r.rate))
	}
	fmt.Fprintf(&b, "loadgen: %d orders placed in %s (%s/s; %s, concurrency %d)\n",
		r.Placed, r.Elapsed.Round(time.Millisecond), fmtRate(achieved), target, r.concurrency)
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "  %-13s %s\n", label, fmt.Sprintf(format, args...))
	}
	line("acknowledged", "%d (201 Created)", len(r.Acknowledged))
	line("rejected", "%d by the API (unknown SKU: 422, expected)", r.RejectedByAPI)
	line("duplicates", "%d sent; %d answers were replays (Idempotent-Replayed)", r.Duplicates, r.Replays)
	if r.cancelConflicts > 0 {
		line("cancelled", "%d (and %d already rejected by the warehouse: 409, expected)", r.Cancelled, r.cancelConflicts)
	} else {
		line("cancelled", "%d", r.Cancelled)
	}
	line("retries", "%d", r.Retries)
	total := 0
	for _, n := range r.Errors {
		total += n
	}
	if total == 0 {
		line("errors", "none")
	} else {
		kinds := slices.Sorted(maps.Keys(r.Errors))
		parts := make([]string, 0, len(kinds))
		for _, k := range kinds {
			parts = append(parts, fmt.Sprintf("%s %d", k, r.Errors[k]))
		}
		line("errors", "%d: %s", total, strings.Join(parts, ", "))
		for _, k := range kinds {
			if ex := r.examples[k]; ex != "" {
				fmt.Fprintf(&b, "  %-13s   %s, e.g. %s\n", "", k, ex)
			}
		}
	}
	if r.latencyCount > 0 || r.Latency != (Percentiles{}) {
		line("latency", "p50 %s  p95 %s  p99 %s  max %s  (%d answers 201 to POST /orders)",
			fmtDuration(r.Latency.P50), fmtDuration(r.Latency.P95), fmtDuration(r.Latency.P99), fmtDuration(r.Latency.Max), r.latencyCount)
	} else {
		line("latency", "no POST /orders answered 201")
	}
	if r.behind {
		line("FELL BEHIND", "placed %d of the %d orders due at %s/s: all %d workers were busy (raise the concurrency, or the shop is slow)",
			r.Placed, r.due, fmtRate(r.rate), r.concurrency)
	}
	if n := r.Errors[kindMismatch]; n > 0 {
		line("MISMATCH", "%d duplicate(s) were not answered with a replay of the first answer: a correctness bug", n)
	}
	if r.keyPrefix != "" {
		line("seed", "%d (Idempotency-Keys %s1 to %s%d)", r.seed, r.keyPrefix, r.keyPrefix, max(r.Placed, 1))
	}
	return b.String()
}

// fmtRate prints a rate without useless decimals: 50, 12.5, 0.25.
func fmtRate(r float64) string {
	if r >= 100 {
		return fmt.Sprintf("%.0f", r)
	}
	s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", r), "0"), ".")
	if s == "" || s == "-0" {
		return "0"
	}
	return s
}

// fmtDuration rounds a latency to three significant digits or so: 812µs, 4.12ms, 1.2s.
func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

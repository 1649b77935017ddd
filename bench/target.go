package bench

import "math"

// Check is a target read off the table: what is wanted, and whether the run met it. It is
// never a pass/fail of the run itself; the table shows it with ✓ or ✗.
type Check struct {
	// Want says the target, e.g. "≥ 60% of A".
	Want string
	// Met is whether the measured value reached the target.
	Met bool
	// Measured is false when a figure the target needs is missing (a phase failed or was
	// skipped); the target then shows as not measured.
	Measured bool
}

// String renders the check for the target column: "✓ ≥ 60% of A", "✗ p99 ≤ 10 ms", or
// "? ≥ 10× peer (not measured)".
func (c Check) String() string {
	switch {
	case c.Want == "":
		return ""
	case !c.Measured:
		return "? " + c.Want + " (not measured)"
	case c.Met:
		return "✓ " + c.Want
	default:
		return "✗ " + c.Want
	}
}

// AtLeast checks got ≥ want. A NaN on either side (a missing figure) is not measured.
func AtLeast(got, want float64, text string) Check {
	if math.IsNaN(got) || math.IsNaN(want) {
		return Check{Want: text}
	}
	return Check{Want: text, Met: got >= want, Measured: true}
}

// AtMost checks got ≤ want. A NaN on either side (a missing figure) is not measured.
func AtMost(got, want float64, text string) Check {
	if math.IsNaN(got) || math.IsNaN(want) {
		return Check{Want: text}
	}
	return Check{Want: text, Met: got <= want, Measured: true}
}

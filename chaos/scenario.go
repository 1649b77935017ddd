package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Scenario is one fault, injected while orders flow, and what must hold afterwards.
type Scenario struct {
	// Name is the command-line name ("relay-after-publish").
	Name string
	// Summary says in one line what is broken and what must happen.
	Summary string
	// Failpoints arms crash points in the first incarnation of services, given the load's
	// rate (so that the N of kill@N falls in the middle of the load).
	Failpoints func(rate float64) map[Service]string
	// Inject runs while the load runs: it injects the fault, waits for evidence that it
	// happened, and heals it. An error means the fault could not be injected or healed,
	// which fails the scenario: a fault that never happened proves nothing.
	Inject func(ctx context.Context, e *Env) error
	// Check adds the scenario's own expectations, once the shop drained.
	Check func(ctx context.Context, e *Env, o *Outcome)
	// MinLoad is the shortest load the scenario needs (its fault lasts longer than the
	// default load): the load runs for the longer of this and the runner's.
	MinLoad time.Duration
	// LoadAfterInject, if set, keeps the load going past MinLoad until Inject returned, and
	// this much longer: a scenario whose faults follow one another, each after the last one
	// healed, needs orders during its last fault however slow the machine makes its first
	// ones (at most maxLoadExtension past MinLoad). Env.Load is the load's least duration
	// while Inject runs and its whole duration once it returned.
	LoadAfterInject time.Duration
	// Settings are environment variables for every service process of the scenario's shop
	// (see [ShopSpec].Settings); Replicas asks for extra processes of a service.
	Settings []string
	Replicas map[Service]int
	// ProcessSettings are environment variables for one process alone, after Settings (see
	// [ShopSpec].ProcessSettings).
	ProcessSettings map[Service][]string
	// OrdersStandby gives the orders database a synchronous standby (see
	// [ShopSpec].OrdersStandby).
	OrdersStandby bool
	// BrokerCluster runs the broker as a three-node cluster (see [ShopSpec].BrokerCluster).
	BrokerCluster bool
	// TLS runs the shop on servers that take TLS alone (see [ShopSpec].TLS).
	TLS bool
	// Network runs the shop on a network lab, each server and process in a network
	// namespace of its own (see [ShopSpec].Network).
	Network bool
	// OutsideCI leaves the scenario out of TestScenarios, which CI runs within its time
	// budget; `make chaos` (run all) runs it. README.md#in-ci says which and why.
	OutsideCI bool
	// PerMessageWarnings are log messages (a line's "msg") that a process logs at WARN once
	// for each message the scenario makes it refuse: the check of the busiest second leaves
	// them out, since their rate is the load's, not a loop's (see spin.go).
	PerMessageWarnings []string
	// RecordAnswers records every POST /orders of the load generator, with its key and
	// answer, in [Env].Answers: what each client was told, and when.
	RecordAnswers bool
}

// Env is what a scenario's Inject and Check work with.
type Env struct {
	Target    Target
	Endpoints Endpoints
	// Rate and Load are the load's orders per second and duration (see
	// [Scenario].LoadAfterInject).
	Rate float64
	Load time.Duration
	// LoadStart is when the load started.
	LoadStart time.Time
	// Probe is an order placed before the load, by the runner, with its key and body.
	Probe Probe
	// Result is the load generator's result; Counts the observer's; Audit the databases'.
	// Set before Check runs.
	Result struct {
		Retries, Replays, Duplicates int
		Acknowledged                 map[string]string
	}
	Counts DeliveryCounts
	Audit  audit
	// Answers holds every POST /orders of the load, when the scenario asked for them
	// ([Scenario].RecordAnswers); nil otherwise.
	Answers *answerLog

	progress func(phase, msg string)
	// processes are the shop's processes (ShopSpec.Processes).
	processes []Service
	// perMessageWarnings are the scenario's PerMessageWarnings.
	perMessageWarnings []string

	mu         sync.Mutex
	faultAt    time.Time
	injected   []string
	seen       []string
	failures   []string
	deadOutbox map[string]int
}

// Fail records a failure the scenario found while its fault lasted (a bound exceeded, say).
// Unlike an error of Inject, it does not mean that the fault did not happen.
func (e *Env) Fail(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failures = append(e.failures, fmt.Sprintf(format, args...))
}

// ExpectDeadOutboxRows tells the verifier that the scenario made n rows of service's outbox
// ("orders", "warehouse") dead on purpose: the drain waits for exactly that many.
func (e *Env) ExpectDeadOutboxRows(service string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.deadOutbox == nil {
		e.deadOutbox = map[string]int{}
	}
	e.deadOutbox[service] = n
}

func (e *Env) expectedDeadOutboxRows() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.deadOutbox)
}

// Probe is the runner's own order.
type Probe struct {
	Key, ID string
	Body    []byte
}

// Fault records that the fault happened at at (the first call sets the fault time, from
// which the time to recover is measured) and what it was.
func (e *Env) Fault(at time.Time, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	e.mu.Lock()
	if e.faultAt.IsZero() {
		e.faultAt = at
	}
	e.injected = append(e.injected, fmt.Sprintf("%s (%.1fs into the load)", msg, at.Sub(e.LoadStart).Seconds()))
	e.mu.Unlock()
	e.progress("fault injected", msg)
}

// Healed records a heal.
func (e *Env) Healed(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	e.mu.Lock()
	e.injected = append(e.injected, fmt.Sprintf("healed: %s (%.1fs into the load)", msg, time.Since(e.LoadStart).Seconds()))
	e.mu.Unlock()
	e.progress("healed", msg)
}

// Saw records an observation.
func (e *Env) Saw(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, fmt.Sprintf(format, args...))
}

// FaultAt is when the fault happened (zero when it did not).
func (e *Env) FaultAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faultAt
}

// AtLoad waits until offset after the start of the load. It reports false if ctx ended.
func (e *Env) AtLoad(ctx context.Context, offset time.Duration) bool {
	return sleepCtx(ctx, time.Until(e.LoadStart.Add(offset)))
}

// registry is every scenario, in the order `run all` runs them.
var registry []Scenario

// register adds scenarios to the registry; names must be unique.
func register(s ...Scenario) {
	for _, sc := range s {
		if _, ok := Lookup(sc.Name); ok {
			panic("chaos: scenario registered twice: " + sc.Name)
		}
		registry = append(registry, sc)
	}
}

// Scenarios returns every scenario, in the order `run all` runs them.
func Scenarios() []Scenario { return slices.Clone(registry) }

// Names returns the names of every scenario.
func Names() []string {
	names := make([]string, len(registry))
	for i, s := range registry {
		names[i] = s.Name
	}
	return names
}

// Lookup finds a scenario by name.
func Lookup(name string) (Scenario, bool) {
	for _, s := range registry {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// Select returns the scenarios named by arg: "all", one name, or several separated by
// commas, in registry order without repeats.
func Select(arg string) ([]Scenario, error) {
	arg = strings.TrimSpace(arg)
	if arg == "all" {
		return Scenarios(), nil
	}
	want := map[string]bool{}
	for _, name := range strings.Split(arg, ",") {
		name = strings.TrimSpace(name)
		if _, ok := Lookup(name); !ok {
			return nil, fmt.Errorf("unknown scenario %q; the scenarios are: all, %s", name, strings.Join(Names(), ", "))
		}
		want[name] = true
	}
	var out []Scenario
	for _, s := range registry {
		if want[s.Name] {
			out = append(out, s)
		}
	}
	return out, nil
}

// Package readiness answers /readyz for the services: whether the process can do its job
// now, dependency by dependency.
//
// A process lists its dependencies as [Check]s: the database (a ping), the broker connection
// of its consumer, its outbox relay. [Handler] runs them all at once, each bounded by a
// timeout, and answers
//
//	200 {"status":"ready","checks":{"database":"up","consumer":"up"}}
//
// or, when any fails, a 503 problem document (application/problem+json, with Retry-After)
// whose detail gives the reasons and whose "checks" member lists every dependency:
//
//	503 {"type":"urn:outboxshop:problem:not-ready","title":"Not ready","status":503,
//	     "detail":"consumer: inbox: consumer not connected to the broker for 41s (since …): …",
//	     "checks":{"database":"up","consumer":"down: inbox: consumer not connected to the broker for 41s (since …): …"}}
//
// A component that says itself whether it can do its job (the outbox relay's Ready, the inbox
// consumer's Ready) is checked with [Ready], given a grace period it tolerates an outage
// for: a broker restart should not take every consumer out of a load balancer at once, a
// consumer that cannot consume for minutes should.
//
// # What a failing probe costs
//
// Nothing here loops or retries: a probe runs the checks once, and the prober (a kubelet, a
// load balancer) sets the pace. A [Ready] check reads its component's state, dialling
// nothing; a [Ping] of the database asks the pool for a connection, so while the database is
// away each probe makes one connection attempt, bounded by [Config].Timeout. The log gets a line per change of readiness, not per probe.
package readiness

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxshop/outboxshop/internal/problem"
)

// Check is one dependency of a process.
type Check struct {
	// Name names the dependency in the answer: "database", "consumer", "relay".
	Name string
	// Check returns nil when the dependency lets the process do its job, else an error that
	// says why not (it is shown to the caller: no secrets). ctx is bounded by Config.Timeout.
	Check func(ctx context.Context) error
}

// Defaults of [Config].
const (
	DefaultTimeout    = 2 * time.Second
	DefaultRetryAfter = 5 * time.Second
)

// Config configures [Handler].
type Config struct {
	// Checks are the dependencies, answered in this order. None: always ready.
	Checks []Check
	// Timeout bounds each check. Default 2s.
	Timeout time.Duration
	// RetryAfter is the Retry-After of a 503. Default 5s.
	RetryAfter time.Duration
	// Logger gets a line when the process becomes not ready, or other checks fail, with the
	// reasons, and one when it is ready again, with how long it was not and how many probes
	// failed: a line per change, not per probe. nil discards.
	Logger *slog.Logger
}

// Handler returns the /readyz handler of cfg.
func Handler(cfg Config) http.Handler {
	h := &handler{
		checks:     cfg.Checks,
		timeout:    cmp.Or(cfg.Timeout, DefaultTimeout),
		retryAfter: strconv.Itoa(max(1, int((cmp.Or(cfg.RetryAfter, DefaultRetryAfter)+time.Second-1)/time.Second))),
		log:        cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
	}
	return h
}

type handler struct {
	checks     []Check
	timeout    time.Duration
	retryAfter string
	log        *slog.Logger

	mu      sync.Mutex
	failing string    // the checks that failed the last probe, "" when ready: to log changes only
	since   time.Time // when the process became not ready
	probes  int       // the probes answered 503 since then
}

// result is the outcome of one check.
type result struct {
	name string
	err  error
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	results := make([]result, len(h.checks))
	var wg sync.WaitGroup
	for i, c := range h.checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
			defer cancel()
			results[i] = result{c.Name, h.run(ctx, c)}
		})
	}
	wg.Wait()

	checks := make(map[string]string, len(results))
	var reasons, failing []string
	for _, res := range results {
		if res.err == nil {
			checks[res.name] = "up"
			continue
		}
		checks[res.name] = "down: " + res.err.Error()
		reasons = append(reasons, res.name+": "+res.err.Error())
		failing = append(failing, res.name)
	}
	h.logChange(r.Context(), strings.Join(failing, ","), strings.Join(reasons, "; "))
	if len(reasons) == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(struct {
			Status string            `json:"status"`
			Checks map[string]string `json:"checks"`
		}{"ready", checks})
		return
	}
	w.Header().Set("Content-Type", problem.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Retry-After", h.retryAfter)
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(struct {
		problem.Details
		Checks map[string]string `json:"checks"`
	}{problem.Details{
		Type: problem.TypeNotReady, Title: "Not ready", Status: http.StatusServiceUnavailable,
		Detail: strings.Join(reasons, "; "), Instance: r.URL.Path,
	}, checks})
}

// run runs c, turning a panic into an error (the panic itself goes to the log, not to the
// caller) and a check that outlives its context into a timeout.
func (h *handler) run(ctx context.Context, c Check) (err error) {
	defer func() {
		if v := recover(); v != nil {
			h.log.ErrorContext(ctx, "readiness check panicked", slog.String("check", c.Name), slog.Any("panic", v))
			err = errors.New("check failed unexpectedly")
		}
	}()
	err = c.Check(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %s", h.timeout)
	}
	return err
}

// logChange logs a change of the set of failing checks (failing, their names), not every
// probe: the reasons of a failing check change from probe to probe ("down for 41s", "for
// 42s"), so they are logged with the change but do not make one. "ready again" says how long
// the process was not ready and how many probes it failed.
func (h *handler) logChange(ctx context.Context, failing, reasons string) {
	h.mu.Lock()
	prev, since, probes := h.failing, h.since, h.probes
	h.failing = failing
	switch {
	case failing == "":
		h.probes = 0
	case prev == "":
		h.since, h.probes = time.Now(), 1
	default:
		h.probes++
	}
	h.mu.Unlock()
	switch {
	case failing == prev:
	case failing == "":
		h.log.InfoContext(ctx, "ready again", slog.Duration("not_ready_for", time.Since(since).Round(time.Millisecond)),
			slog.Int("failed_probes", probes))
	default:
		h.log.WarnContext(ctx, "not ready", slog.String("reasons", reasons))
	}
}

// Ping is a check of a database or any other dependency that answers a ping.
func Ping(ping func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := ping(ctx); err != nil {
			return errors.New("does not answer")
		}
		return nil
	}
}

// Ready returns a check of a component that reports its own readiness, as pkg/outbox's
// Relay.Ready and pkg/inbox/inboxrabbitmq's Consumer.Ready do: ready(grace) returns nil while
// the component can do its job, or has been unable to for at most grace, and otherwise says
// what is down, since when, and why.
func Ready(ready func(maxUnavailable time.Duration) error, grace time.Duration) func(ctx context.Context) error {
	return func(context.Context) error { return ready(grace) }
}

package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// A loop that retries without waiting shows twice: in its log, thousands of warnings a
// second, and in its CPU, a whole core (issue 23: a relay wrote 25,170 lines in one second
// while its database was down). Every scenario checks the first for every process it ran;
// the scenarios that take the database or the broker away also measure the second while it
// is away.

const (
	// maxWarnPerSecond bounds the lines at WARN or ERROR one process may log in one
	// wall-clock second. A process that waits between attempts logs a few a second at worst,
	// whatever the load; INFO lines (one per event processed) are not counted.
	maxWarnPerSecond = 200
	// maxOutageCores bounds the CPU a process may use, in CPU seconds per wall second, while
	// a dependency is away: a loop that spins takes a whole core when it can get one, and
	// about half of one against four other busy processes on two cores; a process that waits
	// used 0.11 at most, on a loaded two-core machine (the README has the measurements).
	maxOutageCores = 0.5
	// minOutageWindow is the shortest outage whose CPU is judged: a shorter one is reported
	// only (a reconnect's burst would weigh too much in it).
	minOutageWindow = 2 * time.Second
)

// LogBurst is one process's busiest second of warnings and errors.
type LogBurst struct {
	Service Service
	// Second is the wall-clock second, from the lines' own timestamps.
	Second time.Time
	// Lines counts the lines at WARN or ERROR in it.
	Lines int
	// Msg is the most frequent message among them, MsgLines how many lines it had.
	Msg      string
	MsgLines int
}

// busiestSecond counts the JSON lines at WARN or ERROR (slog's "WARN", "ERROR", "ERROR+2"…)
// of a process's log per second of their "time", and returns the busiest second, the
// earliest of equals; Lines is 0 when there were none. Other lines (INFO, the runner's
// "### chaos:" lines, a panic's trace) are skipped, and so are those whose msg is one of
// exempt (a scenario's PerMessageWarnings).
func busiestSecond(svc Service, logs string, exempt []string) LogBurst {
	perSecond := map[int64]map[string]int{}
	for line := range strings.Lines(logs) {
		if !strings.Contains(line, `"level":"WARN`) && !strings.Contains(line, `"level":"ERROR`) {
			continue
		}
		var entry struct {
			Time  time.Time `json:"time"`
			Level string    `json:"level"`
			Msg   string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.Time.IsZero() ||
			!strings.HasPrefix(entry.Level, "WARN") && !strings.HasPrefix(entry.Level, "ERROR") ||
			slices.Contains(exempt, entry.Msg) {
			continue
		}
		sec := entry.Time.Unix()
		if perSecond[sec] == nil {
			perSecond[sec] = map[string]int{}
		}
		perSecond[sec][entry.Msg]++
	}
	b := LogBurst{Service: svc}
	for _, sec := range slices.Sorted(maps.Keys(perSecond)) {
		msgs := perSecond[sec]
		n := 0
		for _, c := range msgs {
			n += c
		}
		if n <= b.Lines {
			continue
		}
		b.Second, b.Lines = time.Unix(sec, 0), n
		b.Msg, b.MsgLines = "", 0
		for _, m := range slices.Sorted(maps.Keys(msgs)) {
			if msgs[m] > b.MsgLines {
				b.Msg, b.MsgLines = m, msgs[m]
			}
		}
	}
	return b
}

// checkLogBursts finds the busiest second of warnings and errors of each process, fails the
// scenario for each over maxWarnPerSecond, and returns the busiest of all.
func checkLogBursts(ctx context.Context, e *Env, procs []Service) LogBurst {
	var busiest LogBurst
	var each []string
	for _, svc := range procs {
		logs, err := e.Target.Logs(ctx, svc)
		if err != nil {
			e.Fail("read the log of %s for its warnings and errors: %v", svc, err)
			continue
		}
		b := busiestSecond(svc, logs, e.perMessageWarnings)
		each = append(each, fmt.Sprintf("%s %d", svc, b.Lines))
		if b.Lines > maxWarnPerSecond {
			e.Fail("%s logged %d warnings and errors in the second %s, over %d (%d× %q)",
				svc, b.Lines, b.Second.Format(time.TimeOnly), maxWarnPerSecond, b.MsgLines, b.Msg)
		}
		if b.Lines > busiest.Lines {
			busiest = b
		}
	}
	var besides string
	if len(e.perMessageWarnings) > 0 {
		besides = fmt.Sprintf(" (besides the scenario's warnings per refused message: %q)", e.perMessageWarnings)
	}
	if busiest.Lines > 0 {
		e.Saw("busiest second of warnings and errors%s: %s, %d lines at %s (%d× %q); per process %s",
			besides, busiest.Service, busiest.Lines, busiest.Second.Format(time.TimeOnly), busiest.MsgLines, busiest.Msg, strings.Join(each, ", "))
	} else {
		e.Saw("no process logged a warning or an error%s", besides)
	}
	return busiest
}

// cpuWindow holds every process's CPU time at the start of an outage.
type cpuWindow struct {
	what  string
	start time.Time
	at    map[Service]ProcessCPU
	errs  map[Service]error
}

// outageStarts reads the CPU time of every process of the shop as a dependency goes away
// (what: "the orders database down").
func (e *Env) outageStarts(ctx context.Context, what string) *cpuWindow {
	w := &cpuWindow{what: what, start: time.Now(), at: map[Service]ProcessCPU{}, errs: map[Service]error{}}
	for _, svc := range e.processes {
		w.at[svc], w.errs[svc] = e.Target.CPUTime(ctx, svc)
	}
	return w
}

// outageEnds reads them again as the dependency is back, reports each process's CPU seconds
// per wall second over the window, and fails the scenario for a process above
// maxOutageCores over a window of minOutageWindow or more.
func (e *Env) outageEnds(ctx context.Context, w *cpuWindow) {
	wall := time.Since(w.start)
	var each []string
	for _, svc := range e.processes {
		after, err := e.Target.CPUTime(ctx, svc)
		err = cmp.Or(w.errs[svc], err)
		switch {
		case errors.Is(err, ErrUnsupported):
			each = append(each, fmt.Sprintf("%s unavailable on this target", svc))
		case err != nil:
			each = append(each, fmt.Sprintf("%s not read (%v)", svc, err))
		case after.Incarnation != w.at[svc].Incarnation:
			each = append(each, fmt.Sprintf("%s restarted meanwhile", svc))
		default:
			cores := (after.Used - w.at[svc].Used).Seconds() / wall.Seconds()
			each = append(each, fmt.Sprintf("%s %.2f cores", svc, cores))
			if cores > maxOutageCores && wall >= minOutageWindow {
				e.Fail("%s used %.2f cores while %s (%.1fs), over %.2f: a loop that does not wait",
					svc, cores, w.what, wall.Seconds(), maxOutageCores)
			}
		}
	}
	e.Saw("CPU while %s (%.1fs): %s", w.what, wall.Seconds(), strings.Join(each, ", "))
}

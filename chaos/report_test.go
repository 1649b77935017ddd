package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestReportWording(t *testing.T) {
	t.Parallel()

	t.Run("CountsReadWellAtZeroOneAndMany", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "0 retries", plural(0, "retry", "retries"))
		require.Equal(t, "1 retry", plural(1, "retry", "retries"))
		require.Equal(t, "2 retries", plural(2, "retry", "retries"))
		require.Equal(t, "1 order exists", plural(1, "order exists", "orders exist"))
	})

	t.Run("CountsByNameAreSorted", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "CANCELLED=3, REJECTED=0, RESERVED=17",
			formatCounts(map[string]int{"RESERVED": 17, "CANCELLED": 3, "REJECTED": 0}))
		require.Equal(t, "none", formatCounts(nil))
	})

	t.Run("DeathNamesItsCause", func(t *testing.T) {
		t.Parallel()
		killed := Death{Service: OrdersRelay, Incarnation: 1, Killed: true, Status: "signal: killed"}
		for _, c := range []struct {
			crashPoints string
			killed      bool
			status      string
			want        string
		}{
			{"relay.after-publish=kill@30", true, "signal: killed", "killed by its crash point relay.after-publish (signal: killed)"},
			{"relay.after-publish=kill@30, relay.after-mark=kill", true, "signal: killed",
				"killed by one of its crash points relay.after-publish, relay.after-mark (signal: killed)"},
			{"", true, "signal: killed", "killed by a SIGKILL, no crash point armed (signal: killed)"},
			{"relay.after-publish=kill@30", false, "exit status 1", "ended by itself (exit status 1)"},
			{"", false, "exit status 0", "ended by itself (exit status 0)"},
		} {
			d := killed
			d.CrashPoints, d.Killed, d.Status = crashPointNames(c.crashPoints), c.killed, c.status
			require.Equal(t, c.want, d.Cause(), "%+v", c)
		}
		require.Empty(t, crashPointNames(""))
	})
}

// TestSupervisorDeaths runs real processes under the supervisor: one killed at its crash
// point (it SIGKILLs itself while CHAOS_FAILPOINTS is set, as internal/failpoint does) and
// one that exits with an error. Each death is recorded with its cause, in the Death and in
// the line the supervisor writes into the process's log, and the restarted incarnation runs
// without crash points.
func TestSupervisorDeaths(t *testing.T) {
	t.Parallel()
	script := func(t *testing.T, body, failpoints string) procSpec {
		dir := t.TempDir()
		path := filepath.Join(dir, "svc.sh")
		require.NoError(t, os.WriteFile(path, []byte(body+"\n"), 0o644))
		// Run by sh, not executed itself: see TestProcessStopAndStart's script.
		return procSpec{service: "svc", binary: "/bin/sh", args: []string{path}, logPath: filepath.Join(dir, "svc.log"), failpoints: failpoints}
	}
	// firstDeath waits for the first death and for the second incarnation's "up".
	firstDeath := func(t *testing.T, p *process) (Death, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		d, err := p.waitDeath(ctx)
		require.NoError(t, err)
		var log string
		require.Eventually(t, func() bool {
			b, _ := os.ReadFile(p.spec.logPath)
			log = string(b)
			return strings.Contains(log, "up 2\n")
		}, 10*time.Second, 10*time.Millisecond, "the supervisor restarts the process")
		return d, log
	}
	// The first incarnation says "up 1" and dies as told; a later one says "up 2" and stays
	// up until SIGTERM.
	const body = `trap 'exit 0' TERM; if [ -e "$0.ran" ]; then echo "up 2"; else touch "$0.ran"; echo "up 1"; %s; fi; while :; do sleep 0.05; done`

	t.Run("KilledByItsCrashPoint", func(t *testing.T) {
		t.Parallel()
		spec := script(t, fmt.Sprintf(body, `[ -n "$CHAOS_FAILPOINTS" ] && kill -KILL $$`), "relay.after-publish=kill@3")
		p := newProcess(spec, 10*time.Millisecond)
		t.Cleanup(func() { p.stop(time.Second) })
		require.NoError(t, p.start())
		d, log := firstDeath(t, p)
		require.True(t, d.Killed)
		require.Equal(t, []string{"relay.after-publish"}, d.CrashPoints)
		require.Equal(t, "killed by its crash point relay.after-publish (signal: killed)", d.Cause())
		require.NotContains(t, log, "ended by itself")
		var deathLines []string
		for line := range strings.Lines(log) {
			if isDeathLine(line) {
				deathLines = append(deathLines, line)
			}
		}
		require.Len(t, deathLines, 1, log)
		require.Regexp(t, `^### chaos: svc incarnation 1 ended \S+: killed by its crash point relay.after-publish \(signal: killed\); restarting in 10ms\n$`, deathLines[0])
		require.Contains(t, log, `### chaos: svc incarnation 2 started`)
		require.Len(t, p.Deaths(), 1, "the second incarnation runs without the crash point")
	})

	t.Run("EndedByItself", func(t *testing.T) {
		t.Parallel()
		spec := script(t, fmt.Sprintf(body, `exit 3`), "")
		p := newProcess(spec, 10*time.Millisecond)
		t.Cleanup(func() { p.stop(time.Second) })
		require.NoError(t, p.start())
		d, log := firstDeath(t, p)
		require.False(t, d.Killed)
		require.Empty(t, d.CrashPoints)
		require.Equal(t, "ended by itself (exit status 3)", d.Cause())
		require.Contains(t, log, ": ended by itself (exit status 3); restarting in 10ms\n")
	})
}

// startFails is a target whose shop never starts: a scenario on it fails at once.
type startFails struct{ Target }

func (startFails) Name() string                                  { return "start-fails" }
func (startFails) Prepare(context.Context, func(string)) error   { return nil }
func (startFails) Close() error                                  { return nil }
func (startFails) StopShop(context.Context) error                { return nil }
func (startFails) Logs(context.Context, Service) (string, error) { return "", errors.New("no logs") }
func (startFails) StartShop(context.Context, ShopSpec) (Endpoints, error) {
	return Endpoints{}, errors.New("no shop here")
}

// TestReportDetailsOnce: a failed scenario's details reach the progress once without -v
// (nothing else prints them), and not at all with it (the caller prints them with the table).
func TestReportDetailsOnce(t *testing.T) {
	t.Parallel()
	for _, verbose := range []bool{false, true} {
		t.Run(fmt.Sprintf("Verbose=%t", verbose), func(t *testing.T) {
			t.Parallel()
			var progress bytes.Buffer
			outcomes, err := Run(t.Context(), []Scenario{{Name: "broken", Summary: "a shop that never starts"}},
				Options{Target: startFails{}, Progress: &progress, Verbose: verbose})
			require.NoError(t, err)
			require.Len(t, outcomes, 1)
			require.False(t, outcomes[0].Passed())
			want := 1
			if verbose {
				want = 0
			}
			require.Equal(t, want, strings.Count(progress.String(), "### broken — FAIL"), progress.String())
			require.Equal(t, want, strings.Count(progress.String(), "- **FAIL**: start the shop: no shop here"), progress.String())
		})
	}
}

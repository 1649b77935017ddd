package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProcessStopAndStart runs a real process under the supervisor: a graceful stop is not a
// death and is not restarted, a start after it is the next incarnation, a paused process
// still gets its SIGTERM, and one that ignores SIGTERM is killed after the grace.
func TestProcessStopAndStart(t *testing.T) {
	t.Parallel()
	script := func(t *testing.T, body string) procSpec {
		dir := t.TempDir()
		path := filepath.Join(dir, "svc.sh")
		require.NoError(t, os.WriteFile(path, []byte(body+"\n"), 0o644))
		// Run by sh, not executed itself: a file just written may still be open for writing
		// in a child that a parallel test forked meanwhile, and exec of it then fails with
		// "text file busy" (ETXTBSY); sh only reads it.
		return procSpec{service: "svc", binary: "/bin/sh", args: []string{path}, logPath: filepath.Join(dir, "svc.log")}
	}
	// Exits 0 on SIGTERM; sleeps in short steps so that the trap runs promptly. Says "up"
	// once its trap is set.
	const graceful = `trap 'exit 0' TERM; echo up; while :; do sleep 0.05; done`
	start := func(t *testing.T, p *process) {
		t.Helper()
		require.NoError(t, p.start())
		require.Eventually(t, func() bool {
			b, _ := os.ReadFile(p.spec.logPath)
			return strings.Count(string(b), "\nup\n") == p.incarnation
		}, 10*time.Second, 10*time.Millisecond)
	}

	t.Run("StopIsCleanAndNotRestarted", func(t *testing.T) {
		t.Parallel()
		p := newProcess(script(t, graceful), 10*time.Millisecond)
		t.Cleanup(func() { p.stop(time.Second) })
		start(t, p)
		st := p.halt(5 * time.Second)
		require.True(t, st.Clean(), "%+v", st)
		require.False(t, st.Killed)
		time.Sleep(100 * time.Millisecond) // longer than the restart delay: a restart would show
		p.mu.Lock()
		require.Nil(t, p.cmd, "the supervisor does not bring back a process the runner stopped")
		p.mu.Unlock()
		require.Empty(t, p.Deaths())

		start(t, p)
		p.mu.Lock()
		require.Equal(t, 2, p.incarnation)
		require.NotNil(t, p.cmd)
		p.mu.Unlock()
		log, err := os.ReadFile(p.spec.logPath)
		require.NoError(t, err)
		require.Contains(t, string(log), "### chaos: svc stopped by the runner")
		require.Contains(t, string(log), "### chaos: svc incarnation 2 started")
	})

	t.Run("APausedProcessStops", func(t *testing.T) {
		t.Parallel()
		p := newProcess(script(t, graceful), 10*time.Millisecond)
		t.Cleanup(func() { p.stop(time.Second) })
		start(t, p)
		require.NoError(t, p.signal(syscall.SIGSTOP))
		st := p.halt(5 * time.Second)
		require.True(t, st.Clean(), "SIGCONT follows SIGTERM: %+v", st)
	})

	t.Run("IgnoringSIGTERMIsKilled", func(t *testing.T) {
		t.Parallel()
		p := newProcess(script(t, `trap '' TERM; echo up; while :; do sleep 0.05; done`), 10*time.Millisecond)
		t.Cleanup(func() { p.stop(time.Second) })
		start(t, p)
		st := p.halt(300 * time.Millisecond)
		require.True(t, st.Killed)
		require.False(t, st.Clean())
		require.True(t, strings.Contains(st.Status, "killed"), st.Status)
	})

	t.Run("SignalWhenNotRunning", func(t *testing.T) {
		t.Parallel()
		p := newProcess(script(t, graceful), 10*time.Millisecond)
		require.ErrorContains(t, p.signal(syscall.SIGSTOP), "not running")
		require.Equal(t, "not running", p.halt(time.Second).Status)
	})
}

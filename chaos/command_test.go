package chaos

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// commandHelperEnv makes the test binary a runner that starts one command and waits to be
// killed: TestCommandDiesWithTheRunner's child.
const commandHelperEnv = "CHAOS_TEST_COMMAND_HELPER_NS"

// TestCommandDiesWithTheRunner kills a runner with SIGKILL and requires that what it started
// with command dies with it: beside the runner and in a lab's namespace, as the runner and as
// a server's own user (setpriv changes the user, which clears the parent-death signal unless
// it is set again).
func TestCommandDiesWithTheRunner(t *testing.T) {
	if ns, ok := os.LookupEnv(commandHelperEnv); ok {
		runCommandHelper(t, ns)
		return
	}
	needNetLab(t, "ip", "setpriv")
	acct, err := runAs("postgres")
	require.NoError(t, err)
	lab := setupNetLab(t, "pdeathsig", "a")
	for _, tc := range []struct {
		name string
		ns   string
		user bool
	}{
		{"Beside", "", false},
		{"BesideAsAnotherUser", "", true},
		{"InNamespace", lab.Host("a").NS, false},
		{"InNamespaceAsAnotherUser", lab.Host("a").NS, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.user && acct == nil {
				t.Skip("not root: no other user to run as")
			}
			runner := exec.Command(os.Args[0], "-test.run=^TestCommandDiesWithTheRunner$")
			runner.Env = append(os.Environ(), commandHelperEnv+"="+tc.ns, "CHAOS_TEST_COMMAND_HELPER_USER="+strconv.FormatBool(tc.user))
			out, err := runner.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, runner.Start())
			t.Cleanup(func() { _ = runner.Process.Kill(); _ = runner.Wait() })
			line, err := bufio.NewReader(out).ReadString('\n')
			require.NoError(t, err, "the runner's child pid")
			pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "child ")))
			require.NoError(t, err, line)
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			require.False(t, testinfra.ProcessGone(pid), "the child runs")

			require.NoError(t, runner.Process.Kill())
			_ = runner.Wait()
			eventually(t, 5*time.Second, func() bool { return testinfra.ProcessGone(pid) },
				"the child of a SIGKILLed runner still runs")
		})
	}
}

// runCommandHelper starts a sleep with command, says its pid, and waits to be killed.
func runCommandHelper(t *testing.T, ns string) {
	var acct *account
	if os.Getenv("CHAOS_TEST_COMMAND_HELPER_USER") == "true" {
		var err error
		acct, err = runAs("postgres")
		require.NoError(t, err)
	}
	cmd := command(ns, acct, "sleep", "300")
	require.NoError(t, cmd.Start())
	// Once the user changed (setpriv execs sleep in place), or a kill now would prove nothing.
	eventually(t, 5*time.Second, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
		return err == nil && strings.TrimSpace(string(b)) == "sleep"
	}, "the child execs sleep")
	os.Stdout.WriteString("child " + strconv.Itoa(cmd.Process.Pid) + "\n")
	<-t.Context().Done() // never: the test kills this process first
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// account is a system user a server must run as when the runner is root (initdb and
// postgres refuse root; rabbitmq-server wants its own user).
type account struct {
	cred *syscall.Credential
	uid  int
	gid  int
}

// runAs returns the account named name when the runner is root, and nil (run as the runner)
// otherwise.
func runAs(name string) (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root, the %s user is needed: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	return &account{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid: uid, gid: gid}, nil
}

// chown gives paths to a, when there is one.
func (a *account) chown(paths ...string) error {
	if a == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, a.uid, a.gid); err != nil {
			return err
		}
	}
	return nil
}

// mkdirOwned creates dir (and parents) and gives it to a.
func (a *account) mkdirOwned(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return a.chown(dir)
}

// writeOwned writes the file at path, readable by a alone (or the runner, when a is nil).
func writeOwned(a *account, path string, content []byte) error {
	if err := os.WriteFile(path, content, 0o600); err != nil {
		return err
	}
	return a.chown(path)
}

// copyOwned copies the files src into dir under the names dst, each readable by a alone.
func copyOwned(a *account, dir string, files map[string]string) error {
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := writeOwned(a, filepath.Join(dir, dst), b); err != nil {
			return err
		}
	}
	return nil
}

// groupAttr puts a child in a process group of its own, so that it and every process it
// forks can be killed at once, and so that a Ctrl-C in the runner's terminal reaches only the
// runner, which then stops its children in order. The child is killed if the runner dies.
func groupAttr(a *account) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if a != nil {
		attr.Credential = a.cred
	}
	return attr
}

// command returns the command that runs name with args as a's user (the runner's when a is
// nil), in a process group of its own (groupAttr), in the network namespace ns when ns is set.
//
// In a namespace it runs through `ip netns exec`, which also puts the namespace's own
// /etc/netns/<ns>/hosts over /etc/hosts (the broker nodes find each other by name there),
// and switches to a's user with setpriv after entering it: entering a namespace needs root.
// Both exec in place, so the command's process is the program's own: signals to it reach
// the program.
func command(ns string, a *account, name string, args ...string) *exec.Cmd {
	name, args, attr := inNamespace(ns, a, name, args)
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = attr
	return cmd
}

// commandContext is command, killed when ctx ends (exec.CommandContext).
func commandContext(ctx context.Context, ns string, a *account, name string, args ...string) *exec.Cmd {
	name, args, attr := inNamespace(ns, a, name, args)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = attr
	return cmd
}

func inNamespace(ns string, a *account, name string, args []string) (string, []string, *syscall.SysProcAttr) {
	if ns == "" {
		return name, args, groupAttr(a)
	}
	argv := []string{"netns", "exec", ns}
	if a != nil {
		// The kernel clears the parent-death signal when the user changes: setpriv sets it
		// again, so the server still dies with the runner (groupAttr).
		argv = append(argv, "setpriv", "--reuid="+strconv.Itoa(a.uid), "--regid="+strconv.Itoa(a.gid), "--clear-groups", "--pdeathsig=keep")
	}
	return "ip", append(append(argv, name), args...), groupAttr(nil)
}

// signalGroup sends sig to the process group led by pid. A group that is already gone is
// not an error.
func signalGroup(pid int, sig syscall.Signal) error {
	if pid <= 0 {
		return nil
	}
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", pid, err)
	}
	return nil
}

// groupProcess is a started server (a PostgreSQL postmaster, a RabbitMQ start script) that
// leads a process group of its own (see groupAttr).
type groupProcess struct {
	pid    int
	exited chan struct{} // closed once the leader has exited
}

// startGroupProcess starts cmd and watches for its exit.
func startGroupProcess(cmd *exec.Cmd) (*groupProcess, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &groupProcess{pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the leader is still there; false for a nil process.
func (p *groupProcess) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// waitGone waits until the leader has exited and no process of its group is left.
func (p *groupProcess) waitGone(ctx context.Context) error {
	select {
	case <-p.exited:
	case <-ctx.Done():
		return fmt.Errorf("did not exit: %w", ctx.Err())
	}
	if err := waitGroupGone(ctx, p.pid); err != nil {
		return fmt.Errorf("processes of its group did not exit: %w", err)
	}
	return nil
}

// groupAlive reports whether any process of the group led by pid is still there.
func groupAlive(pid int) bool {
	return pid > 0 && syscall.Kill(-pid, 0) == nil
}

// waitGroupGone polls until the group led by pid has no process left, or ctx ends.
func waitGroupGone(ctx context.Context, pid int) error {
	return poll(ctx, 20*time.Millisecond, func() (bool, error) { return !groupAlive(pid), nil })
}

// poll calls cond every interval until it reports done, fails, or ctx ends.
func poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sleepCtx waits for d or until ctx ends, and reports whether the whole wait passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tcpAnswers reports whether something accepts connections on addr.
func tcpAnswers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// tcpRefuses reports whether addr refuses connections: its host is up and answers, and
// nothing listens there (ECONNREFUSED). A timeout or any other failure is not a refusal.
func tcpRefuses(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// lookBin finds a server binary: on PATH, or in the first of dirs that has it.
func lookBin(name string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		p := d + "/" + name
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH nor in %v", name, dirs)
}

// userHZ is the unit of the CPU times in /proc: USER_HZ, 100 on every architecture Linux and
// Go share (sysconf(_SC_CLK_TCK) would need cgo to ask).
const userHZ = 100

// procCPUTime returns the CPU time (user and system, every thread) process pid has used.
func procCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads utime and stime, fields 14 and 15 of /proc/<pid>/stat, counted after
// the command name (field 2, in parentheses, which may hold spaces and parentheses).
func parseProcStat(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat without a command name: %.40q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat with %d fields after the command name", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc stat: %w", err)
	}
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

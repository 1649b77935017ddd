package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procSpec says how to run one service process.
type procSpec struct {
	service Service
	binary  string
	args    []string
	// env is the process's environment, without CHAOS_FAILPOINTS.
	env []string
	// failpoints is CHAOS_FAILPOINTS of the first incarnation only.
	failpoints string
	logPath    string
	// readyURL answers 200 once the process is ready; readyBody, when set, must appear in
	// the answer too (the warehouse's /readyz says whether its consumer is connected).
	readyURL, readyBody string
	// ns is the network namespace the process runs in, when the shop is on a network lab.
	ns string
}

// process is a supervised service process: when it dies without the runner asking, the
// supervisor records the death and starts it again after restartDelay, without its crash
// points. That restart is the "heal" of a crash-point scenario.
type process struct {
	spec         procSpec
	restartDelay time.Duration

	mu          sync.Mutex
	cmd         *exec.Cmd
	incarnation int
	wanted      bool // the runner wants it up: restart it when it dies
	deaths      []Death
	exited      chan struct{} // closed when the current incarnation exits
	changed     chan struct{} // closed and replaced on every start and death
	restarting  sync.WaitGroup
	ctx         context.Context
	cancel      context.CancelFunc
	startErr    error
	lastStatus  string // how the last incarnation ended
}

func newProcess(spec procSpec, restartDelay time.Duration) *process {
	ctx, cancel := context.WithCancel(context.Background())
	return &process{spec: spec, restartDelay: restartDelay, changed: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// configure appends settings to the environment of the process's next incarnations.
func (p *process) configure(settings []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spec.env = append(slices.Clip(p.spec.env), settings...)
}

// command is the process's binary and environment (without crash points).
func (p *process) command() (string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spec.binary, slices.Clone(p.spec.env)
}

// start starts the next incarnation.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *process) startLocked() error {
	logf, err := os.OpenFile(p.spec.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.incarnation++
	env := append([]string(nil), p.spec.env...)
	fp := ""
	if p.incarnation == 1 && p.spec.failpoints != "" {
		fp = p.spec.failpoints
		env = append(env, "CHAOS_FAILPOINTS="+fp)
	}
	fmt.Fprintf(logf, "### chaos: %s incarnation %d started %s failpoints=%q\n",
		p.spec.service, p.incarnation, time.Now().Format(time.RFC3339Nano), fp)
	cmd := command(p.spec.ns, nil, p.spec.binary, p.spec.args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.spec.service, err)
	}
	p.cmd, p.wanted = cmd, true
	exited := make(chan struct{})
	p.exited = exited
	p.notifyLocked()
	incarnation := p.incarnation
	go p.wait(cmd, incarnation, crashPointNames(fp), exited)
	return nil
}

func (p *process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait records the end of one incarnation, which ran with crashPoints armed, and restarts
// the process if the runner still wants it.
func (p *process) wait(cmd *exec.Cmd, incarnation int, crashPoints []string, exited chan struct{}) {
	err := cmd.Wait()
	now := time.Now()
	status := "exit status 0"
	killed := false
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		status = ee.String()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			killed = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastStatus = status
	if p.cmd == cmd {
		p.cmd = nil
	}
	close(exited)
	if !p.wanted {
		p.notifyLocked()
		return // stopped by the runner
	}
	d := Death{Service: p.spec.service, Incarnation: incarnation, At: now, Killed: killed, Status: status, CrashPoints: crashPoints}
	p.deaths = append(p.deaths, d)
	if logf, err := os.OpenFile(p.spec.logPath, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(logf, "### chaos: %s incarnation %d ended %s: %s; restarting in %s\n",
			p.spec.service, incarnation, now.Format(time.RFC3339Nano), d.Cause(), p.restartDelay)
		_ = logf.Close()
	}
	p.notifyLocked()
	p.restarting.Add(1)
	go func() {
		defer p.restarting.Done()
		if !sleepCtx(p.ctx, p.restartDelay) {
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.wanted || p.cmd != nil {
			return
		}
		if err := p.startLocked(); err != nil {
			p.startErr = err
			p.notifyLocked()
		}
	}()
}

// isDeathLine reports whether line is the one wait writes into the service's log when an
// incarnation ended without the runner asking: "### chaos: orders-api incarnation 1 ended
// <time>: killed by its crash point api.after-commit (signal: killed); restarting in 500ms".
func isDeathLine(line string) bool {
	return strings.HasPrefix(line, "### chaos: ") && strings.Contains(line, " incarnation ") && strings.Contains(line, " ended ")
}

// waitDeath waits for the first death of the process by itself.
func (p *process) waitDeath(ctx context.Context) (Death, error) {
	for {
		p.mu.Lock()
		if len(p.deaths) > 0 {
			d := p.deaths[0]
			p.mu.Unlock()
			return d, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return Death{}, ctx.Err()
		case <-changed:
		}
	}
}

// Deaths returns the deaths so far.
func (p *process) Deaths() []Death {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Death(nil), p.deaths...)
}

// waitReady waits until an incarnation is running (after a restart: the supervisor starts it
// after restartDelay) and then until it is ready.
func (p *process) waitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		running, changed, err := p.cmd != nil, p.changed, p.startErr
		exited := p.exited
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if running {
			return p.ready(ctx, exited)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not come back: %w", p.spec.service, ctx.Err())
		case <-changed:
		}
	}
}

var readyClient = &http.Client{Timeout: 2 * time.Second}

// ready polls the readiness URL until it answers as wanted, the incarnation exits, or ctx
// ends.
func (p *process) ready(ctx context.Context, exited <-chan struct{}) error {
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("%s exited while starting: %s", p.spec.service, tail(p.spec.logPath, 15))
		default:
		}
		resp, err := readyClient.Get(p.spec.readyURL)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), p.spec.readyBody), nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s to be ready (%s): %w", p.spec.service, p.spec.readyURL, err)
	}
	return nil
}

// stop stops the process for good: SIGTERM, and SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	p.cancel()
	p.halt(grace)
}

// halt stops the current incarnation, if there is one: SIGTERM (and SIGCONT, so that a
// paused process gets it), SIGKILL after grace. The supervisor does not restart it; start
// does, as a new incarnation.
func (p *process) halt(grace time.Duration) Stopped {
	p.mu.Lock()
	p.wanted = false
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	p.restarting.Wait() // a restart after a death sees wanted unset and gives up
	st := Stopped{Service: p.spec.service}
	if cmd == nil {
		st.Status = "not running"
		return st
	}
	start := time.Now()
	_ = signalGroup(cmd.Process.Pid, syscall.SIGTERM)
	_ = signalGroup(cmd.Process.Pid, syscall.SIGCONT)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		st.Killed = true
		_ = signalGroup(cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	st.Took = time.Since(start)
	p.mu.Lock()
	st.Status = p.lastStatus
	p.mu.Unlock()
	if logf, err := os.OpenFile(p.spec.logPath, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(logf, "### chaos: %s stopped by the runner %s after %s (%s, killed=%t)\n",
			p.spec.service, time.Now().Format(time.RFC3339Nano), st.Took.Round(time.Millisecond), st.Status, st.Killed)
		_ = logf.Close()
	}
	return st
}

// signal sends sig to the current incarnation's process group.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s is not running", p.spec.service)
	}
	return signalGroup(cmd.Process.Pid, sig)
}

// cpuTime reads the current incarnation's CPU time from /proc.
func (p *process) cpuTime() (ProcessCPU, error) {
	p.mu.Lock()
	cmd, incarnation := p.cmd, p.incarnation
	p.mu.Unlock()
	if cmd == nil {
		return ProcessCPU{}, fmt.Errorf("%s is not running", p.spec.service)
	}
	used, err := procCPUTime(cmd.Process.Pid)
	return ProcessCPU{Incarnation: incarnation, Used: used}, err
}

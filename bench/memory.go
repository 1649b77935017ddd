package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MemoryResult is item 8: the peak RSS of a relay process while it drained Rows rows.
type MemoryResult struct {
	Rows int
	// PeakRSS is the process's VmHWM, in bytes.
	PeakRSS int64
	// Rate is the rows/s the process reported (a cross-check of item 3).
	Rate float64
	Err  error
}

// relayPackage is the relay program of the memory phase.
const relayPackage = "github.com/outboxshop/outboxshop/bench/cmd/relay"

// memory is item 8: it builds bench/cmd/relay afresh (or uses Config.RelayBinary), lets it
// drain a copy of the backlog as a process of its own, and reads VmHWM from
// /proc/<pid>/status once it reported the backlog drained.
func (e *env) memory(ctx context.Context, rows int) MemoryResult {
	res := MemoryResult{Rows: rows}
	bin, cleanup, err := e.relayBinary(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	defer cleanup()
	name, dbURL, top, err := e.copyBacklog(ctx, "memory", rows)
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { _ = e.dropDatabase(context.WithoutCancel(ctx), name) }()
	snk, err := e.startSink(top.Queue, 200*time.Millisecond)
	if err != nil {
		res.Err = err
		return res
	}
	defer snk.Close()

	var stderr bytes.Buffer
	cmd, lines, err := startProcess(ctx, &stderr, bin, "-database-url", dbURL, "-amqp-url", e.cfg.AMQPURL,
		"-batch", strconv.Itoa(e.cfg.BatchSize), "-rows", strconv.Itoa(rows))
	if err != nil {
		res.Err = err
		return res
	}
	pid := cmd.Process.Pid
	var drained string
	select {
	case drained = <-lines:
	case <-time.After(drainTimeout(rows)):
	case <-ctx.Done():
	}
	hwm, hwmErr := readVmHWM(pid)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	waitErr := cmd.Wait()
	switch f := strings.Fields(drained); {
	case len(f) != 3 || f[0] != "drained":
		res.Err = errors.Join(fmt.Errorf("the relay process did not report the backlog drained (%q)", drained),
			waitErr, errors.New(strings.TrimSpace(stderr.String())))
	case hwmErr != nil:
		res.Err = hwmErr
	default:
		secs, _ := strconv.ParseFloat(f[2], 64)
		res.PeakRSS, res.Rate = hwm, float64(rows)/secs
	}
	return res
}

// relayBinary returns the relay program: Config.RelayBinary, or ./bench/cmd/relay built
// afresh into a temporary directory that cleanup removes.
func (e *env) relayBinary(ctx context.Context) (bin string, cleanup func(), err error) {
	if e.cfg.RelayBinary != "" {
		return e.cfg.RelayBinary, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "bench-relay-")
	if err != nil {
		return "", func() {}, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	bin = filepath.Join(dir, "relay")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, relayPackage).CombinedOutput()
	if err != nil {
		cleanup()
		return "", func() {}, fmt.Errorf("go build %s (run the bench from the repository): %w: %s", relayPackage, err, bytes.TrimSpace(out))
	}
	return bin, cleanup, nil
}

// startProcess starts bin with args, its standard error to stderr (nil: discarded), and
// returns it with its standard output's lines.
func startProcess(ctx context.Context, stderr io.Writer, bin string, args ...string) (*exec.Cmd, <-chan string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", bin, err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines, nil
}

// readVmHWM reads the peak resident set size of process pid from /proc/<pid>/status.
func readVmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read VmHWM (Linux only): %w", err)
	}
	return parseVmHWM(b)
}

// parseVmHWM finds the line "VmHWM:   12345 kB" of a /proc/<pid>/status file and returns
// the bytes.
func parseVmHWM(status []byte) (int64, error) {
	for line := range strings.Lines(string(status)) {
		rest, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmHWM line %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected VmHWM line %q: %w", strings.TrimSpace(line), err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no VmHWM line in the process status")
}

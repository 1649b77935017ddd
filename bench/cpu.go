package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// userHZ is the unit of the CPU times in /proc (USER_HZ, clock ticks per second): 100 on
// every Linux architecture the bench runs on; the kernel keeps it fixed for user space
// whatever its own tick rate.
const userHZ = 100

// CPUUsage is the CPU time that the processes taking part in a measurement spent while it
// ran, read from /proc before and after: the bench's own process (the relays, or the
// publisher of limit A, or Watermill's forwarder), the PostgreSQL backends of its
// connections, and the broker's beam.smp; and the share of the machine that stayed idle.
// A part that could not be read (a server on another machine, no /proc) is negative.
type CPUUsage struct {
	// Messages is how many messages the measurement moved; the figures per 1,000 divide by it.
	Messages int
	// Elapsed is the wall-clock time between the two samples.
	Elapsed time.Duration
	// Process, Postgres and Broker are CPU times (user + system) during Elapsed.
	Process, Postgres, Broker time.Duration
	// Idle is the machine's idle share (idle + iowait of every CPU) during Elapsed, 0 to 1;
	// NaN when unknown.
	Idle float64
}

// PerThousand returns d per 1,000 messages, or a negative duration when d is unknown or no
// message was moved.
func (u CPUUsage) PerThousand(d time.Duration) time.Duration {
	if d < 0 || u.Messages <= 0 {
		return -1
	}
	return time.Duration(float64(d) * 1000 / float64(u.Messages))
}

// CPUShare returns a's CPU per message over b's: every part each measured (the process, its
// PostgreSQL backends, the broker), summed. Two measurements that keep the machine equally
// busy move messages in that ratio, so for a relay's row against limit A it is the share of
// A that the CPU per message allows. NaN when either is missing or b's database or broker
// part is unknown (a drain's sum would then be short).
func CPUShare(a, b *CPUUsage) float64 {
	if a == nil || b == nil || a.Messages <= 0 || b.Messages <= 0 || a.Broker < 0 || b.Broker < 0 || b.Postgres < 0 {
		return math.NaN()
	}
	sum := func(u *CPUUsage) time.Duration {
		d := u.PerThousand(u.Process) + u.PerThousand(u.Broker)
		if u.Postgres >= 0 {
			d += u.PerThousand(u.Postgres)
		}
		return d
	}
	return Ratio(float64(sum(a)), float64(sum(b)))
}

// Cores returns how many CPUs d kept busy on average during Elapsed, or NaN.
func (u CPUUsage) Cores(d time.Duration) float64 {
	if d < 0 || u.Elapsed <= 0 {
		return math.NaN()
	}
	return float64(d) / float64(u.Elapsed)
}

// FormatCPU renders u per 1,000 messages, naming the bench's process as process: "relay
// 52.0 ms · pg 50.1 ms · broker 139 ms · idle 37%". An unknown part is left out; nil or
// no messages is "—".
func FormatCPU(u *CPUUsage, process string) string {
	if u == nil || u.Messages <= 0 {
		return "—"
	}
	var parts []string
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{process, u.Process}, {"pg", u.Postgres}, {"broker", u.Broker}} {
		if d := u.PerThousand(p.d); d >= 0 {
			parts = append(parts, p.name+" "+FormatLatency(d))
		}
	}
	if !math.IsNaN(u.Idle) {
		parts = append(parts, "idle "+FormatPercent(u.Idle))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, " · ")
}

// ParseProcStat returns the user + system CPU time, in clock ticks, from the contents of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may itself contain
// spaces and parentheses, so the fields are counted from the last ")".
func ParseProcStat(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	// After the name: field 3 (state) onwards; utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the command name, want at least 13", len(f))
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat stime: %w", err)
	}
	return utime + stime, nil
}

// ParseProcStatCPU returns the machine's total and idle (idle + iowait) CPU time, in clock
// ticks, from the "cpu" line of /proc/stat.
func ParseProcStatCPU(b []byte) (total, idle uint64, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 6 {
			return 0, 0, fmt.Errorf("proc stat: cpu line has %d fields, want at least 6", len(f))
		}
		// user nice system idle iowait irq softirq steal guest guest_nice; guest time is
		// already counted in user and nice, so it is left out of the total.
		for j, s := range f[1:min(len(f), 9)] {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("proc stat cpu field %d: %w", j+1, err)
			}
			total += v
			if j == 3 || j == 4 {
				idle += v
			}
		}
		return total, idle, nil
	}
	return 0, 0, errors.New("proc stat: no cpu line")
}

// ticks converts clock ticks to a duration.
func ticks(n uint64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// BackendTicks returns the CPU ticks that a set of processes spent between two samples
// (pid → ticks). A process only in after started in between and counts whole; one only in
// before ended in between, and what it spent since before is lost (not counted).
func BackendTicks(before, after map[int]uint64) uint64 {
	var sum uint64
	for pid, a := range after {
		b := before[pid]
		if a >= b { // a pid reused by a new process reads less: count it whole
			sum += a - b
		} else {
			sum += a
		}
	}
	return sum
}

// IdleShare returns the idle share of the machine between two /proc/stat samples, or NaN.
func IdleShare(totalBefore, idleBefore, totalAfter, idleAfter uint64) float64 {
	if totalAfter <= totalBefore || idleAfter < idleBefore {
		return math.NaN()
	}
	return float64(idleAfter-idleBefore) / float64(totalAfter-totalBefore)
}

// readProcTicks reads the CPU ticks of pid from /proc; name, when set, must be the process's
// command name (so that a pid of another machine is not read on this one).
func readProcTicks(pid int, name string) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	if name != "" {
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open || !strings.HasPrefix(string(b[open+1:end]), name) {
			return 0, fmt.Errorf("pid %d is not %s", pid, name)
		}
	}
	return ParseProcStat(b)
}

// cpuMeter samples the CPU of one measurement: the bench's process, the PostgreSQL backends
// whose application_name starts with appPrefix (none when empty), and the broker.
type cpuMeter struct {
	e         *env
	appPrefix string

	at           time.Time
	self         uint64
	selfOK       bool
	backends     map[int]uint64
	backendsOK   bool
	broker       uint64
	brokerOK     bool
	machineTotal uint64
	machineIdle  uint64
	machineOK    bool
}

// startCPU takes the first sample. A part that cannot be read is left out of the result.
func (e *env) startCPU(ctx context.Context, appPrefix string) *cpuMeter {
	m := &cpuMeter{e: e, appPrefix: appPrefix}
	m.sample(ctx)
	return m
}

func (m *cpuMeter) sample(ctx context.Context) {
	m.at = time.Now()
	var err error
	m.self, err = readProcTicks(os.Getpid(), "")
	m.selfOK = err == nil
	m.backends, m.backendsOK = nil, false
	if m.appPrefix != "" {
		m.backends, m.backendsOK = m.e.backendTicks(ctx, m.appPrefix)
	}
	m.broker, m.brokerOK = 0, false
	if pid := m.e.brokerPID(); pid > 0 {
		if t, err := readProcTicks(pid, ""); err == nil {
			m.broker, m.brokerOK = t, true
		}
	}
	m.machineTotal, m.machineIdle, m.machineOK = 0, 0, false
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		if total, idle, err := ParseProcStatCPU(b); err == nil {
			m.machineTotal, m.machineIdle, m.machineOK = total, idle, true
		}
	}
}

// stop takes the second sample and returns the usage for messages moved.
func (m *cpuMeter) stop(ctx context.Context, messages int) *CPUUsage {
	before := *m
	m.sample(ctx)
	u := &CPUUsage{Messages: messages, Elapsed: m.at.Sub(before.at), Process: -1, Postgres: -1, Broker: -1, Idle: math.NaN()}
	// Not before.self > 0: a process that has just started may not have used a tick yet
	// (the first measurement of a run then had no publisher CPU).
	if before.selfOK && m.selfOK && m.self >= before.self {
		u.Process = ticks(m.self - before.self)
	}
	if before.backendsOK && m.backendsOK {
		u.Postgres = ticks(BackendTicks(before.backends, m.backends))
	}
	if before.brokerOK && m.brokerOK && m.broker >= before.broker {
		u.Broker = ticks(m.broker - before.broker)
	}
	if before.machineOK && m.machineOK {
		u.Idle = IdleShare(before.machineTotal, before.machineIdle, m.machineTotal, m.machineIdle)
	}
	return u
}

// selectBackendsSQL lists the backends of the connections whose application_name starts
// with $1.
const selectBackendsSQL = `SELECT pid FROM pg_stat_activity WHERE starts_with(application_name, $1)`

// backendTicks returns the CPU ticks of the PostgreSQL backends of the connections named
// appPrefix…, read from /proc: false when the server's processes are not on this machine.
func (e *env) backendTicks(ctx context.Context, appPrefix string) (map[int]uint64, bool) {
	conn, err := pgx.Connect(ctx, e.cfg.PostgresURL)
	if err != nil {
		return nil, false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, selectBackendsSQL, appPrefix)
	if err != nil {
		return nil, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, false
	}
	out := make(map[int]uint64, len(pids))
	for _, pid := range pids {
		t, err := readProcTicks(int(pid), "postgres")
		if err != nil {
			return nil, false
		}
		out[int(pid)] = t
	}
	return out, true
}

// brokerPID returns the pid of the process listening on the AMQP URL's port on this
// machine (beam.smp), found once per run through /proc/net/tcp{,6} and the processes'
// open sockets; 0 when there is none here or it cannot be read.
func (e *env) brokerPID() int {
	e.brokerOnce.Do(func() {
		port, err := amqpPort(e.cfg.AMQPURL)
		if err != nil {
			return
		}
		inodes := map[string]bool{}
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, ino := range ListeningInodes(b, port) {
				inodes[ino] = true
			}
		}
		if len(inodes) == 0 {
			return
		}
		e.brokerPid = findSocketOwner(inodes)
	})
	return e.brokerPid
}

// amqpPort returns the port of an AMQP URL, with the scheme's default.
func amqpPort(raw string) (int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, err
	}
	if p := u.Port(); p != "" {
		return strconv.Atoi(p)
	}
	if u.Scheme == "amqps" {
		return 5671, nil
	}
	return 5672, nil
}

// ListeningInodes returns the socket inodes of the listening sockets on port in the
// contents of /proc/net/tcp or /proc/net/tcp6.
func ListeningInodes(b []byte, port int) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != "0A" { // 0A is TCP_LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			out = append(out, f[9])
		}
	}
	return out
}

// findSocketOwner returns the pid of a process holding one of the socket inodes, or 0.
func findSocketOwner(inodes map[string]bool) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(p + "/fd/" + fd.Name())
			if err != nil {
				continue
			}
			if ino, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
				return pid
			}
		}
	}
	return 0
}

// withAppName returns dbURL with its application_name set, so that the connections' backends
// can be found in pg_stat_activity.
func withAppName(dbURL, name string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestNetLab runs the network lab for real: namespaces on a bridge, nftables rules and
// NFQUEUE delays, with small TCP and UDP servers inside the namespaces. It needs root, ip and
// nft (Debian packages iproute2, nftables), and iptables-nft for the delays (Debian package
// iptables); without them it skips, saying so, and under CI=true fails instead.
func TestNetLab(t *testing.T) {
	t.Parallel()
	needNetLab(t, "ip", "nft", "iptables-nft")

	// Alone, before the labs of the other subtests: their sweeps would race with its fakes.
	t.Run("SweepRemovesDeadRunnersLabs", testNetLabSweep)
	t.Run("Labs", func(t *testing.T) {
		t.Run("HostsTalk", testNetLabHostsTalk)
		t.Run("PartitionBothWays", testNetLabPartitionBothWays)
		t.Run("PartitionOneWay", testNetLabPartitionOneWay)
		t.Run("Loss", testNetLabLoss)
		t.Run("Delay", testNetLabDelay)
		t.Run("CloseRemovesEverything", testNetLabClose)
	})
	// Every subtest has ended: no thread of this process may be in a lab's namespace.
	self, err := os.Readlink("/proc/self/ns/net")
	require.NoError(t, err)
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread ended meanwhile
		}
		require.NoError(t, err)
		require.Equal(t, self, ns, "thread %s is in another network namespace", task.Name())
	}
}

// needNetLab skips the test (fails it under CI=true) unless it runs as root with tools on
// PATH.
func needNetLab(t *testing.T, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "the network lab needs " + strings.Join(missing, ", ") +
		" (Debian packages iproute2, nftables, iptables)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + "; skipped (under CI=true this fails)")
}

// setupNetLab makes a lab with hosts, closed when the test ends.
func setupNetLab(t *testing.T, id string, hosts ...string) *netLab {
	t.Helper()
	lab, err := newNetLab(t.Context(), id)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lab.Close()) })
	for _, h := range hosts {
		start := time.Now()
		_, err := lab.AddHost(t.Context(), h)
		require.NoError(t, err)
		t.Logf("AddHost %s took %v", h, time.Since(start).Round(time.Millisecond))
	}
	return lab
}

// A nil *netHost below is the runner, in the root namespace.

// ipOf is h's address on the lab.
func ipOf(lab *netLab, h *netHost) string {
	if h == nil {
		return lab.RunnerIP()
	}
	return h.IP
}

// inHost calls f in h's namespace (in the runner's when h is nil).
func inHost(h *netHost, f func() error) error {
	if h == nil {
		return f()
	}
	return h.inNS(f)
}

// echoServer answers on TCP with what it reads.
type echoServer struct {
	addr  string
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// startEcho starts an echo server on h, stopped when the test ends.
func startEcho(t *testing.T, lab *netLab, h *netHost) *echoServer {
	t.Helper()
	s := &echoServer{}
	require.NoError(t, inHost(h, func() error {
		var err error
		s.ln, err = net.Listen("tcp", net.JoinHostPort(ipOf(lab, h), "0"))
		return err
	}))
	s.addr = s.ln.Addr().String()
	s.wg.Go(func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		_ = s.ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// dial connects from h to addr within timeout; the connection is closed when the test ends.
func dial(t *testing.T, h *netHost, addr string, timeout time.Duration) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := inHost(h, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nil
}

// requireDial connects from h to the echo server s and checks that it answers.
func requireDial(t *testing.T, h *netHost, s *echoServer) net.Conn {
	t.Helper()
	c, err := dial(t, h, s.addr, 5*time.Second)
	require.NoError(t, err, "dial %s", s.addr)
	rtt, err := roundTrip(c, 5*time.Second)
	require.NoError(t, err, "echo from %s", s.addr)
	require.Less(t, rtt, time.Second)
	return c
}

// requireCut checks that a connection from h to s cannot be made: the SYN goes unanswered
// (a timeout, not a refusal).
func requireCut(t *testing.T, h *netHost, s *echoServer) {
	t.Helper()
	_, err := dial(t, h, s.addr, 500*time.Millisecond)
	require.Error(t, err, "dial %s through a partition", s.addr)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "want a timeout (a silent drop), got %v", err)
}

// roundTrip writes a byte to an echo connection and waits for it to come back.
func roundTrip(c net.Conn, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// udpCounter counts the datagrams it receives, by sender address and first byte.
type udpCounter struct {
	addr   string
	conn   *net.UDPConn
	wg     sync.WaitGroup
	mu     sync.Mutex
	counts map[string]int
}

// startUDPCounter listens for UDP on h until the test ends.
func startUDPCounter(t *testing.T, lab *netLab, h *netHost) *udpCounter {
	t.Helper()
	u := &udpCounter{counts: map[string]int{}}
	require.NoError(t, inHost(h, func() error {
		var err error
		u.conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ipOf(lab, h))})
		return err
	}))
	// Room for every datagram of a burst: the test counts them, it does not race the reader.
	rc, err := u.conn.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	}))
	require.NoError(t, serr)
	u.addr = u.conn.LocalAddr().String()
	u.wg.Go(func() {
		buf := make([]byte, 64)
		for {
			n, from, err := u.conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if n > 0 {
				u.mu.Lock()
				u.counts[from.IP.String()+" "+string(buf[:1])]++
				u.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() {
		_ = u.conn.Close()
		u.wg.Wait()
	})
	return u
}

// count is the number of datagrams whose first byte is kind received from ip.
func (u *udpCounter) count(ip string, kind byte) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[ip+" "+string(kind)]
}

// udpSender opens a UDP socket in h's namespace aimed at addr.
func udpSender(t *testing.T, h *netHost, addr string) *net.UDPConn {
	t.Helper()
	raddr, err := net.ResolveUDPAddr("udp4", addr)
	require.NoError(t, err)
	var c *net.UDPConn
	require.NoError(t, inHost(h, func() error {
		var err error
		c, err = net.DialUDP("udp4", nil, raddr)
		return err
	}))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sendUDP sends n datagrams whose first byte is kind.
func sendUDP(t *testing.T, c *net.UDPConn, kind byte, n int) {
	t.Helper()
	for range n {
		_, err := c.Write([]byte{kind, 0, 0, 0})
		require.NoError(t, err, "a drop is silent: the sender does not see it")
	}
}

// eventually polls cond every 10ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	err := poll(ctx, 10*time.Millisecond, func() (bool, error) { return cond(), nil })
	require.NoError(t, err, append([]any{msg}, args...)...)
}

// flushed sends markers from the runner (never cut) to u until u has one: what was sent to
// u before is in by then.
func flushed(t *testing.T, lab *netLab, u *udpCounter) {
	t.Helper()
	runner := udpSender(t, nil, u.addr)
	eventually(t, 10*time.Second, func() bool {
		sendUDP(t, runner, 'm', 1)
		return u.count(lab.RunnerIP(), 'm') > 0
	}, "a marker from the runner to %s", u.addr)
}

// testNetLabHostsTalk: three hosts reach each other and the runner, and the runner them;
// Run and Start work inside a host's namespace.
func testNetLabHostsTalk(t *testing.T) {
	t.Parallel()
	lab := setupNetLab(t, "talk", "a", "b", "c")
	hosts := []*netHost{nil, lab.Host("a"), lab.Host("b"), lab.Host("c")}
	require.Nil(t, lab.Host("nobody"))
	servers := make([]*echoServer, len(hosts))
	for i, h := range hosts {
		servers[i] = startEcho(t, lab, h)
	}
	for i, from := range hosts {
		for j := range hosts {
			if i != j {
				requireDial(t, from, servers[j])
			}
		}
	}

	out, err := lab.Host("a").Run(t.Context(), "ip", "-o", "-4", "addr", "show")
	require.NoError(t, err)
	require.Contains(t, string(out), lab.Host("a").IP+"/24")
	require.NotContains(t, string(out), lab.RunnerIP())
	out, err = lab.Host("a").Run(t.Context(), "ip", "-o", "-6", "addr", "show", "dev", "eth0")
	require.NoError(t, err)
	require.Empty(t, string(out), "IPv4 alone: no address a partition would miss")
	_, err = lab.Host("a").Run(t.Context(), "false")
	require.ErrorContains(t, err, "false in a")

	// Each TCP segment leaves a host as a packet of its own (no GSO burst), so that loss and
	// delay count real packets.
	txBefore := txPackets(t, lab.Host("a"))
	const size = 1 << 20
	bulk := requireDial(t, lab.Host("a"), servers[2])
	require.NoError(t, bulk.SetDeadline(time.Now().Add(30*time.Second)))
	werr := make(chan error, 1)
	go func() { _, err := bulk.Write(make([]byte, size)); werr <- err }()
	_, err = io.ReadFull(bulk, make([]byte, size))
	require.NoError(t, err)
	require.NoError(t, <-werr)
	sent := txPackets(t, lab.Host("a")) - txBefore
	require.GreaterOrEqual(t, sent, size/1500, "1 MiB sent in %d packets", sent)

	// Start: the child is in the host's namespace, with the attributes the caller set.
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, lab.Host("b").Start(cmd))
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	child, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	require.NoError(t, err)
	var want unix.Stat_t
	require.NoError(t, unix.Stat(netnsDir+"/"+lab.Host("b").NS, &want))
	require.Equal(t, fmt.Sprintf("net:[%d]", want.Ino), child)
	pgid, err := syscall.Getpgid(cmd.Process.Pid)
	require.NoError(t, err)
	require.Equal(t, cmd.Process.Pid, pgid, "Setpgid was kept")

	// A command that cannot start leaves no thread behind (TestNetLab checks) and says why.
	require.Error(t, lab.Host("b").Start(exec.Command("/nonexistent/binary")))
}

// testNetLabPartitionBothWays: {a} cut from {b, c} both ways; b and c and the runner are
// not; after Heal, a stalled connection carries on and new ones work.
func testNetLabPartitionBothWays(t *testing.T) {
	t.Parallel()
	lab := setupNetLab(t, "part2", "a", "b", "c")
	a, b, c := lab.Host("a"), lab.Host("b"), lab.Host("c")
	sa, sb, sc, sr := startEcho(t, lab, a), startEcho(t, lab, b), startEcho(t, lab, c), startEcho(t, lab, nil)
	ab := requireDial(t, a, sb)
	ba := requireDial(t, b, sa)

	require.NoError(t, lab.Partition(t.Context(), []string{"a"}, []string{"b", "c"}, true))
	requireCut(t, a, sb)
	requireCut(t, a, sc)
	requireCut(t, b, sa)
	requireCut(t, c, sa)
	// An established connection stalls: the write is taken, the answer never comes.
	for _, conn := range []net.Conn{ab, ba} {
		_, err := roundTrip(conn, time.Second)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "want a timeout, got %v", err)
	}
	requireDial(t, b, sc)
	requireDial(t, c, sb)
	requireDial(t, nil, sa)
	requireDial(t, a, sr)

	require.NoError(t, lab.Heal(t.Context()))
	// The byte written during the partition is retransmitted and echoed.
	for _, conn := range []net.Conn{ab, ba} {
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
		_, err := io.ReadFull(conn, make([]byte, 1))
		require.NoError(t, err, "the stalled connection carries on after Heal")
		_, err = roundTrip(conn, 5*time.Second)
		require.NoError(t, err)
	}
	requireDial(t, a, sb)
	requireDial(t, c, sa)
	require.NoError(t, lab.Heal(t.Context()), "Heal without faults")

	require.ErrorContains(t, lab.Partition(t.Context(), []string{"a"}, []string{"nobody"}, true), "no host nobody")
	require.ErrorContains(t, lab.Partition(t.Context(), []string{"a"}, []string{"a", "b"}, true), "both sides")
}

// testNetLabPartitionOneWay: a → b dropped, b → a delivered.
func testNetLabPartitionOneWay(t *testing.T) {
	t.Parallel()
	lab := setupNetLab(t, "part1", "a", "b")
	a, b := lab.Host("a"), lab.Host("b")
	ua, ub := startUDPCounter(t, lab, a), startUDPCounter(t, lab, b)
	toB, toA := udpSender(t, a, ub.addr), udpSender(t, b, ua.addr)

	require.NoError(t, lab.Partition(t.Context(), []string{"a"}, []string{"b"}, false))
	sendUDP(t, toB, 'd', 50)
	sendUDP(t, toA, 'd', 50)
	eventually(t, 10*time.Second, func() bool { return ua.count(b.IP, 'd') == 50 }, "b → a delivered (%d of 50)", ua.count(b.IP, 'd'))
	flushed(t, lab, ub)
	require.Zero(t, ub.count(a.IP, 'd'), "a → b dropped")

	require.NoError(t, lab.Heal(t.Context()))
	sendUDP(t, toB, 'd', 50)
	eventually(t, 10*time.Second, func() bool { return ub.count(a.IP, 'd') == 50 }, "a → b after Heal (%d of 50)", ub.count(a.IP, 'd'))
}

// testNetLabLoss: 50% loss lets about half of 400 datagrams through, each way; none is lost
// after Heal.
func testNetLabLoss(t *testing.T) {
	t.Parallel()
	lab := setupNetLab(t, "loss", "a", "b", "c")
	a, b, c := lab.Host("a"), lab.Host("b"), lab.Host("c")
	ua, ub := startUDPCounter(t, lab, a), startUDPCounter(t, lab, b)
	toB, toA, cToB := udpSender(t, a, ub.addr), udpSender(t, b, ua.addr), udpSender(t, c, ub.addr)

	require.ErrorContains(t, lab.Loss(t.Context(), []string{"a"}, []string{"b"}, 101), "0 to 100")
	require.NoError(t, lab.Loss(t.Context(), []string{"a"}, []string{"b"}, 50))
	const n = 400
	sendUDP(t, toB, 'd', n)
	sendUDP(t, toA, 'd', n)
	sendUDP(t, cToB, 'd', n)
	flushed(t, lab, ub)
	flushed(t, lab, ua)
	gotB, gotA := ub.count(a.IP, 'd'), ua.count(b.IP, 'd')
	t.Logf("with 50%% loss: a → b %d of %d, b → a %d of %d", gotB, n, gotA, n)
	for _, got := range []int{gotA, gotB} {
		require.GreaterOrEqual(t, got, n*20/100)
		require.LessOrEqual(t, got, n*80/100)
	}
	require.Equal(t, n, ub.count(c.IP, 'd'), "c → b is not lossy")

	require.NoError(t, lab.Heal(t.Context()))
	sendUDP(t, toB, 'd', n)
	eventually(t, 10*time.Second, func() bool { return ub.count(a.IP, 'd') == gotB+n },
		"after Heal every datagram arrives (%d of %d)", ub.count(a.IP, 'd')-gotB, n)
}

// testNetLabDelay: a delay of 100ms each way adds 200ms to the round trip between a and b
// and none to a and c; a jitter spreads it; a bulk transfer goes through; Heal removes it.
func testNetLabDelay(t *testing.T) {
	t.Parallel()
	lab := setupNetLab(t, "delay", "a", "b", "c")
	a := lab.Host("a")
	sb, sc := startEcho(t, lab, lab.Host("b")), startEcho(t, lab, lab.Host("c"))
	ab, ac := requireDial(t, a, sb), requireDial(t, a, sc)
	rtts := func(c net.Conn, n int) []time.Duration {
		t.Helper()
		var ds []time.Duration
		for range n {
			d, err := roundTrip(c, 5*time.Second)
			require.NoError(t, err)
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return ds
	}
	base := rtts(ab, 5)[2]
	t.Logf("round trip a ↔ b without delay: %v", base)

	require.NoError(t, lab.Delay(t.Context(), []string{"a"}, []string{"b"}, 100*time.Millisecond, 0))
	delayed := rtts(ab, 5)
	t.Logf("round trips a ↔ b with 100ms each way: %v", delayed)
	require.GreaterOrEqual(t, delayed[0], base+150*time.Millisecond)
	require.Less(t, delayed[4], time.Second)
	// Medians against a busy machine: a delayed round trip takes 200ms at least.
	require.Less(t, rtts(ac, 5)[2], 100*time.Millisecond, "a ↔ c is not delayed")
	// A new connection takes its handshake's round trip.
	start := time.Now()
	requireDial(t, a, sb)
	require.GreaterOrEqual(t, time.Since(start), 2*150*time.Millisecond, "handshake and echo, delayed")

	require.NoError(t, lab.Heal(t.Context()))
	require.Less(t, rtts(ab, 5)[2], 100*time.Millisecond, "Heal removes the delay")

	// A jitter: each packet held 20ms plus up to 60ms more, each way.
	require.NoError(t, lab.Delay(t.Context(), []string{"b"}, []string{"a"}, 20*time.Millisecond, 60*time.Millisecond))
	jittered := rtts(ab, 20)
	t.Logf("round trips a ↔ b with 20ms + [0, 60ms) each way: %v", jittered)
	require.GreaterOrEqual(t, jittered[0], 40*time.Millisecond)
	require.Less(t, jittered[19], time.Second)
	require.Greater(t, jittered[19]-jittered[0], 10*time.Millisecond, "the jitter spreads the round trips")

	// Many packets at once: 4 MiB through the echo and back, delayed and reordered.
	const size = 4 << 20
	bulk := requireDial(t, a, sb)
	require.NoError(t, bulk.SetDeadline(time.Now().Add(60*time.Second)))
	sent := make([]byte, size)
	for i := range sent {
		sent[i] = byte(i * 7)
	}
	start = time.Now()
	werr := make(chan error, 1)
	go func() { _, err := bulk.Write(sent); werr <- err }()
	got := make([]byte, size)
	_, err := io.ReadFull(bulk, got)
	require.NoError(t, err)
	require.NoError(t, <-werr)
	require.Equal(t, sent, got)
	t.Logf("4 MiB echoed through the jittered delay in %v", time.Since(start).Round(time.Millisecond))

	require.NoError(t, lab.Heal(t.Context()))
	require.Less(t, rtts(ab, 5)[2], 100*time.Millisecond, "Heal removes the delay")
	require.ErrorContains(t, lab.Delay(t.Context(), []string{"a"}, []string{"b"}, 0, 0), "positive")
}

// testNetLabClose: Close kills what runs in the namespaces and removes the namespaces, the
// veths and the bridge, also with faults in place; a second Close does nothing.
func testNetLabClose(t *testing.T) {
	t.Parallel()
	lab, err := newNetLab(t.Context(), "close")
	require.NoError(t, err)
	var names []string
	for _, n := range []string{"a", "b"} {
		h, err := lab.AddHost(t.Context(), n)
		require.NoError(t, err)
		names = append(names, h.NS, h.veth)
	}
	names = append(names, lab.bridge)
	_, err = lab.AddHost(t.Context(), "a")
	require.ErrorContains(t, err, "already there")
	require.NoError(t, lab.Partition(t.Context(), []string{"a"}, []string{"b"}, true))
	require.NoError(t, lab.Delay(t.Context(), []string{"a"}, []string{"b"}, time.Second, 0))
	// A daemon left in a namespace (as epmd would be) is killed by Close.
	cmd := exec.Command("sleep", "60")
	require.NoError(t, lab.Host("a").Start(cmd))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	present := labNames(t)
	for _, n := range names {
		require.Contains(t, present, n)
	}
	require.NoError(t, lab.Close())
	require.NoError(t, lab.Close(), "a second Close")
	select {
	case err := <-exited:
		require.ErrorContains(t, err, "killed")
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the namespace outlived Close")
	}
	present = labNames(t)
	for _, n := range names {
		require.NotContains(t, present, n)
	}
	_, err = lab.AddHost(t.Context(), "c")
	require.ErrorContains(t, err, "closed")
	require.NoError(t, lab.Heal(t.Context()))
}

// testNetLabSweep: what a dead runner's labs left (a namespace with a process in it, a
// veth, a bridge, named with its pid) is swept; a live process's names are not.
func testNetLabSweep(t *testing.T) {
	ctx := t.Context()
	// A pid that was a process's and is no longer.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	pid := dead.Process.Pid
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH)
	require.True(t, processGone(pid))
	require.False(t, processGone(os.Getpid()))
	// A SIGKILLed runner that its parent has not reaped yet is gone too.
	zombie := exec.Command("sleep", "60")
	require.NoError(t, zombie.Start())
	require.NoError(t, zombie.Process.Kill())
	eventually(t, 10*time.Second, func() bool { return processGone(zombie.Process.Pid) }, "a zombie is gone")
	_ = zombie.Wait()

	ns := fmt.Sprintf("%s%d-gone-a", netnsPrefix, pid)
	veth := fmt.Sprintf("%s%d-zz", vethPrefix, pid)
	bridge := fmt.Sprintf("%s%d-zz", bridgePrefix, pid)
	// Names of their own for concurrent runs of this test.
	tag := strconv.FormatInt(int64(os.Getpid()), 36)
	live := fmt.Sprintf("%s1-%s", bridgePrefix, tag) // pid 1 is alive
	mine := fmt.Sprintf("%s%d-zzz", bridgePrefix, os.Getpid())
	script := fmt.Sprintf("netns add %s\nlink add %s type veth peer name eth0 netns %s\n"+
		"link add name %s type bridge\nlink set %s master %s\nlink add name %s type bridge\nlink add name %s type bridge\n",
		ns, veth, ns, bridge, veth, bridge, live, mine)
	t.Cleanup(func() {
		for _, n := range []string{live, mine, veth, bridge} {
			_ = deleteLink(context.Background(), n)
		}
		_ = removeNetHost(context.Background(), ns, "")
	})
	// A process left in the dead runner's namespace.
	cmd := exec.Command("sleep", "60")
	// Under the lock, or a concurrent lab's sweep could take the namespace first.
	err := func() error {
		unlock, err := lockFile(netLabLock)
		if err != nil {
			return err
		}
		defer unlock()
		if out, err := runInput(ctx, []byte(script), "ip", "-batch", "-"); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return (&netHost{Name: "a", NS: ns}).Start(cmd)
	}()
	require.NoError(t, err)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The dead runner's hosts file, and that of a namespace of its already gone.
	gone := fmt.Sprintf("%s%d-gone-b", netnsPrefix, pid)
	for _, n := range []string{ns, gone} {
		require.NoError(t, os.MkdirAll(etcNetnsDir+"/"+n, 0o755))
		require.NoError(t, os.WriteFile(etcNetnsDir+"/"+n+"/hosts", []byte("10.0.0.1 x\n"), 0o644))
		t.Cleanup(func() { _ = os.RemoveAll(etcNetnsDir + "/" + n) })
	}

	require.NoError(t, sweepNetLabs(ctx))
	for _, n := range []string{ns, gone} {
		require.NoDirExists(t, etcNetnsDir+"/"+n, "swept")
	}
	present := labNames(t)
	for _, n := range []string{ns, veth, bridge} {
		require.NotContains(t, present, n, "swept")
	}
	require.Contains(t, present, live, "pid 1 is alive")
	require.Contains(t, present, mine, "this process is alive")
	select {
	case err := <-exited:
		require.ErrorContains(t, err, "killed")
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the dead runner's namespace outlived the sweep")
	}
}

// txPackets is the number of packets h's eth0 has sent.
func txPackets(t *testing.T, h *netHost) int {
	t.Helper()
	out, err := h.Run(t.Context(), "ip", "-j", "-s", "link", "show", "dev", "eth0")
	require.NoError(t, err)
	var links []struct {
		Stats64 struct {
			TX struct {
				Packets int `json:"packets"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	require.NoError(t, json.Unmarshal(out, &links), "%s", out)
	require.Len(t, links, 1)
	return links[0].Stats64.TX.Packets
}

// labNames lists the namespaces and interfaces of the machine.
func labNames(t *testing.T) []string {
	t.Helper()
	var names []string
	out, err := runInput(t.Context(), nil, "ip", "netns", "list")
	require.NoError(t, err, "%s", out)
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return names
}

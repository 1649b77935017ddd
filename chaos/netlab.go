package chaos

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Names, places and limits of the network lab (see [netLab]).
const (
	netnsPrefix   = "obsn"
	bridgePrefix  = "obb"
	vethPrefix    = "obv"
	netnsDir      = "/run/netns"
	etcNetnsDir   = "/etc/netns"
	netLabLock    = "/run/obsnetlab.lock"
	maxIfNameLen  = 15
	netLabMaxHost = 254
	// delayQueueLen is the number of packets a delay holds at most in one namespace; the
	// kernel drops the packets beyond it, as a full router queue would.
	delayQueueLen = 16384
)

// netLabSeq numbers the bridges and veths of this process.
var netLabSeq atomic.Uint64

// netLabName is the pattern of a lab's own names: a known prefix, the creating process's pid,
// a dash and the rest.
var netLabName = regexp.MustCompile(`^(` + netnsPrefix + `|` + bridgePrefix + `|` + vethPrefix + `)([0-9]+)-(.+)$`)

// netLabWord is what a lab id and a host name may be made of.
var netLabWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$`)

// netLab is a private network of namespaces on one bridge. It puts the hosts of a chaos run (broker nodes, database servers, service
// processes) into network namespaces of their own on one Linux bridge, so that a scenario can
// cut, thin out or slow down the traffic between any two sets of them, while the runner (the
// load generator, the verifier) stays in the root namespace and reaches every host.
//
//	runner (root namespace) 10.X.Y.1 ── bridge obb<pid>-<n>
//	                                      ├── obv<pid>-<n> ══ eth0 10.X.Y.2  namespace obsn<pid>-<id>-a
//	                                      ├── obv<pid>-<n> ══ eth0 10.X.Y.3  namespace obsn<pid>-<id>-b
//	                                      └── …
//
// # Names
//
// Everything a lab makes is named after the process that made it, so that [sweepNetLabs] can
// tell what a runner that died (SIGKILL, a crash) left behind:
//
//   - namespace: obsn<pid>-<id>-<host> (a file in /run/netns; no length limit)
//   - bridge: obb<pid>-<n>
//   - a host's veth pair: obv<pid>-<n> in the root namespace, on the bridge; eth0 in the
//     host's namespace
//
// <n> is a counter of the process, in base 36, so that an interface name stays within its
// 15 bytes (a pid has at most 7 digits).
//
// # Faults
//
// Partitions and loss are nftables rules in each host's own namespace, in a table netdev
// chaos on its eth0 that the lab writes whole on every change (nft -f, one transaction):
// an egress chain for what the host sends, an ingress chain for what it receives. Drops at
// the device are silent also to the sending process (a drop in the output hook would fail
// its UDP sends with EPERM).
//
// A delay queues the packets it holds with iptables-nft's NFQUEUE target (nft's own queue
// statement needs a kernel module, NFT_QUEUE, that this lab does not count on) to a
// goroutine of the runner that reads the queue over netlink and lets each packet through
// once its time has come (see [nfqDelayer]).
//
// The lab owns the firewall of its hosts' namespaces: Heal deletes table netdev chaos and
// iptables' table ip filter there.
//
// A host's eth0 sends each TCP segment as a packet of its own (gso_max_segs 1; a veth would
// otherwise pass bursts of up to 64 KiB as one packet), so loss and delay count real packets.
// The lab is IPv4 alone: its interfaces get no IPv6 address, not even a link-local one.
//
// # Needs
//
// Root, ip (iproute2) and nft (nftables); for Delay, iptables-nft (Debian package iptables).
// Where the machine has bridge-nf-call-iptables on, traffic between hosts also passes the root
// namespace's forward hook: a firewall there that drops forwarded packets (Docker's) cuts the
// hosts from each other.
//
// Its methods are safe for concurrent use.
type netLab struct {
	id     string
	pid    int
	bridge string
	subnet netip.Prefix // 10.X.Y.0/24

	mu        sync.Mutex
	hosts     map[string]*netHost
	order     []*netHost          // in the order they were added
	rules     map[string]*nsRules // by host name: the partitions and loss on its eth0
	touched   map[string]bool     // hosts whose namespace has had rules since the last Heal
	delays    []*nfqDelayer
	nextQueue uint16
	closed    bool
}

// netHost is one namespace on the lab's bridge, with its own address.
type netHost struct {
	// Name is the name given to AddHost.
	Name string
	// NS is the namespace's name, as ip netns knows it (/run/netns/<NS>).
	NS string
	// IP is the host's address on the bridge.
	IP string

	lab  *netLab
	veth string // the root namespace's end of its veth pair
}

// nsRules are the rules of one host's table netdev chaos: on what it receives (ingress)
// and on what it sends (egress).
type nsRules struct {
	ingress, egress []string
}

// newNetLab creates a bridge with a fresh private /24 (10.X.Y.0/24, used by no address nor
// route of the machine) and gives the runner address .1 on it. id distinguishes the labs
// open at once in one process (it is part of the namespaces' names). It first removes what
// labs of dead runners left behind (sweepNetLabs).
func newNetLab(ctx context.Context, id string) (*netLab, error) {
	if !netLabWord.MatchString(id) {
		return nil, fmt.Errorf("netlab: lab id %q: want letters, digits, '.', '_' or '-', at most 40", id)
	}
	// Sweeping, choosing a free subnet and taking it are one step for every lab of the
	// machine.
	unlock, err := lockFile(netLabLock)
	if err != nil {
		return nil, fmt.Errorf("netlab: new lab %s: %w", id, err)
	}
	defer unlock()
	if err := sweepLocked(ctx); err != nil {
		return nil, fmt.Errorf("netlab: new lab %s: %w", id, err)
	}
	l := &netLab{
		id:      id,
		pid:     os.Getpid(),
		hosts:   map[string]*netHost{},
		rules:   map[string]*nsRules{},
		touched: map[string]bool{},
	}
	if l.bridge, err = l.ifName(bridgePrefix); err != nil {
		return nil, fmt.Errorf("netlab: new lab %s: %w", id, err)
	}
	if l.subnet, err = freeSubnet(ctx); err != nil {
		return nil, fmt.Errorf("netlab: new lab %s: %w", id, err)
	}
	batch := fmt.Sprintf("link add name %s type bridge stp_state 0\nlink set %s addrgenmode none\n"+
		"addr add %s/24 dev %s\nlink set %s up\n",
		l.bridge, l.bridge, l.RunnerIP(), l.bridge, l.bridge)
	if out, err := runInput(ctx, []byte(batch), "ip", "-batch", "-"); err != nil {
		_, _ = runInput(context.WithoutCancel(ctx), nil, "ip", "link", "delete", l.bridge)
		return nil, fmt.Errorf("netlab: new lab %s: bridge %s: %w: %s", id, l.bridge, err, out)
	}
	return l, nil
}

// ifName is a new interface name of this process with prefix.
func (l *netLab) ifName(prefix string) (string, error) {
	name := prefix + strconv.Itoa(l.pid) + "-" + strconv.FormatUint(netLabSeq.Add(1), 36)
	if len(name) > maxIfNameLen {
		return "", fmt.Errorf("interface name %s is longer than %d bytes", name, maxIfNameLen)
	}
	return name, nil
}

// addr is the address .n of the lab's subnet.
func (l *netLab) addr(n int) string {
	a := l.subnet.Addr().As4()
	a[3] = byte(n)
	return netip.AddrFrom4(a).String()
}

// RunnerIP is the root namespace's address on the bridge.
func (l *netLab) RunnerIP() string { return l.addr(1) }

// Subnet is the lab's network, "10.X.Y.0/24".
func (l *netLab) Subnet() string { return l.subnet.String() }

// AddHost creates a namespace with loopback up and a veth pair to the bridge, its end in the
// namespace named eth0 with the next free address (.2, .3, …). It takes a few milliseconds.
func (l *netLab) AddHost(ctx context.Context, name string) (*netHost, error) {
	if !netLabWord.MatchString(name) {
		return nil, fmt.Errorf("netlab: add host %q: want letters, digits, '.', '_' or '-', at most 40", name)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("netlab: add host %s: the lab is closed", name)
	}
	if l.hosts[name] != nil {
		return nil, fmt.Errorf("netlab: add host %s: already there", name)
	}
	n := len(l.order) + 2
	if n > netLabMaxHost {
		return nil, fmt.Errorf("netlab: add host %s: the lab's /24 is full", name)
	}
	veth, err := l.ifName(vethPrefix)
	if err != nil {
		return nil, fmt.Errorf("netlab: add host %s: %w", name, err)
	}
	h := &netHost{
		Name: name,
		NS:   fmt.Sprintf("%s%d-%s-%s", netnsPrefix, l.pid, l.id, name),
		IP:   l.addr(n),
		lab:  l,
		veth: veth,
	}
	// The namespace's end is created in the namespace, so its name eth0 cannot clash.
	root := fmt.Sprintf("netns add %s\nlink add %s type veth peer name eth0 netns %s\n"+
		"link set %s addrgenmode none\nlink set %s master %s up\n",
		h.NS, veth, h.NS, veth, veth, l.bridge)
	inside := fmt.Sprintf("link set lo up\nlink set eth0 addrgenmode none gso_max_segs 1\n"+
		"addr add %s/24 dev eth0\nlink set eth0 up\n", h.IP)
	out, err := runInput(ctx, []byte(root), "ip", "-batch", "-")
	if err == nil {
		out, err = runInput(ctx, []byte(inside), "ip", "-netns", h.NS, "-batch", "-")
	}
	if err != nil {
		cleanup := removeNetHost(context.WithoutCancel(ctx), h.NS, veth)
		return nil, errors.Join(fmt.Errorf("netlab: add host %s: %w: %s", name, err, out), cleanup)
	}
	l.hosts[name] = h
	l.order = append(l.order, h)
	return h, nil
}

// Host is the host added under name, nil when there is none.
func (l *netLab) Host(name string) *netHost {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hosts[name]
}

// Start starts cmd (not yet started; its SysProcAttr may set Credential, Setpgid, Pdeathsig)
// inside the host's namespace. The forking thread is locked, moved into the namespace for
// cmd.Start alone and moved back, so no thread of the runner stays in the host's namespace.
// A Pdeathsig is bound to that thread, which lives on after Start (it goes back to the Go
// runtime's pool): the child gets its signal when the runner dies.
func (h *netHost) Start(cmd *exec.Cmd) error {
	err := h.inNS(cmd.Start)
	if err != nil && cmd.Process != nil {
		// Started, but its thread could not come back and is dropped: the caller gets no
		// process to wait for, so end it here.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("netlab: start %s in %s: %w", cmd.Path, h.Name, err)
	}
	return nil
}

// Run runs a command inside the host's namespace and returns its combined output; the error
// says what failed and carries the output too.
func (h *netHost) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return h.runInput(ctx, nil, name, args...)
}

// runInput is Run with stdin.
func (h *netHost) runInput(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.Start(cmd); err != nil {
		return nil, err
	}
	if err := cmd.Wait(); err != nil {
		return out.Bytes(), fmt.Errorf("netlab: %s in %s: %w: %s", name, h.Name, err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// inNS calls f on a thread of its own that is in the host's namespace for the call. The
// thread goes back to the runner's namespace afterwards; should that fail, the thread stays
// locked and the Go runtime ends it with its goroutine, so no thread of the runner is ever
// left in the wrong namespace. Sockets opened by f stay in the host's namespace.
func (h *netHost) inNS(f func() error) error {
	target, err := unix.Open(netnsDir+"/"+h.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", h.NS, err)
	}
	defer unix.Close(target)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open the runner's namespace: %w", err)
			return
		}
		defer unix.Close(home)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter namespace %s: %w", h.NS, err)
			return
		}
		ferr := f()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			// Locked and never unlocked: the runtime ends this thread with the goroutine.
			done <- errors.Join(ferr, fmt.Errorf("back to the runner's namespace (the thread is dropped): %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Partition drops every packet from each host of a to each host of b; with bothWays, from
// each host of b to each host of a too. A one-way cut leaves b → a alone. The drops are
// silent (no RST, no ICMP), so established TCP connections stall as in a real partition,
// and go on after Heal. The rules are set on both sides (what the sender sends and what the
// receiver receives). The runner is never cut.
func (l *netLab) Partition(ctx context.Context, a, b []string, bothWays bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ha, hb, err := l.sets(a, b)
	if err != nil {
		return fmt.Errorf("netlab: partition: %w", err)
	}
	cut := func(from, to []*netHost, what string) {
		for _, h := range from {
			l.rule(h).egress = append(l.rule(h).egress, fmt.Sprintf("ip daddr %s counter drop comment %q", ipSet(to), what))
		}
		for _, h := range to {
			l.rule(h).ingress = append(l.rule(h).ingress, fmt.Sprintf("ip saddr %s counter drop comment %q", ipSet(from), what))
		}
	}
	what := fmt.Sprintf("partition %v -> %v", a, b)
	cut(ha, hb, what)
	if bothWays {
		cut(hb, ha, fmt.Sprintf("partition %v <- %v", a, b))
	}
	if err := l.apply(ctx, slices.Concat(ha, hb)); err != nil {
		return fmt.Errorf("netlab: partition %v from %v: %w", a, b, err)
	}
	return nil
}

// Loss drops percent% of the packets (at random, each on its own) between each host of a and
// each host of b, both ways. It is applied once per direction, at the sender.
func (l *netLab) Loss(ctx context.Context, a, b []string, percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("netlab: loss of %d%%: want 0 to 100", percent)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ha, hb, err := l.sets(a, b)
	if err != nil {
		return fmt.Errorf("netlab: loss: %w", err)
	}
	what := fmt.Sprintf("loss %d%% %v <-> %v", percent, a, b)
	lose := func(from, to []*netHost) {
		for _, h := range from {
			l.rule(h).egress = append(l.rule(h).egress,
				fmt.Sprintf("ip daddr %s numgen random mod 100 < %d counter drop comment %q", ipSet(to), percent, what))
		}
	}
	lose(ha, hb)
	lose(hb, ha)
	if err := l.apply(ctx, slices.Concat(ha, hb)); err != nil {
		return fmt.Errorf("netlab: loss between %v and %v: %w", a, b, err)
	}
	return nil
}

// Delay holds every packet between each host of a and each host of b, both ways, for d plus
// a random jitter in [0, jitter), drawn for each packet, then lets it through: a round trip
// between the sets takes 2d more (plus up to twice the jitter). As with netem, a jitter
// reorders packets. The packets are queued at the receiver's input hook (iptables-nft's
// NFQUEUE target) to a goroutine of the runner (an [nfqDelayer] per namespace). Delays of two
// calls over the same pair of hosts do not add up: the first one set holds the packets.
// Delay needs iptables-nft (Debian package iptables).
func (l *netLab) Delay(ctx context.Context, a, b []string, d, jitter time.Duration) error {
	if d < 0 || jitter < 0 || d+jitter == 0 {
		return fmt.Errorf("netlab: delay %v, jitter %v: want a positive delay or jitter", d, jitter)
	}
	iptables, err := exec.LookPath("iptables-nft")
	if err != nil {
		return fmt.Errorf("netlab: delay needs iptables-nft (Debian package iptables): %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ha, hb, err := l.sets(a, b)
	if err != nil {
		return fmt.Errorf("netlab: delay: %w", err)
	}
	l.nextQueue++
	queue := l.nextQueue
	hold := func(at, from []*netHost) error {
		for _, h := range at {
			dl, err := startDelayer(h, queue, d, jitter)
			if err != nil {
				return err
			}
			l.delays = append(l.delays, dl)
			l.touched[h.Name] = true
			if _, err := h.Run(ctx, iptables, "-w", "-A", "INPUT", "-s", ipList(from),
				"-j", "NFQUEUE", "--queue-num", strconv.Itoa(int(queue))); err != nil {
				return err
			}
		}
		return nil
	}
	if err := errors.Join(hold(hb, ha), hold(ha, hb)); err != nil {
		return fmt.Errorf("netlab: delay between %v and %v: %w", a, b, err)
	}
	return nil
}

// Heal removes every partition, loss and delay: the rules first, then the delays, which let
// the packets they still hold through at once. Connections that survived carry on.
func (l *netLab) Heal(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	return l.heal(ctx)
}

// heal is Heal with l.mu held.
func (l *netLab) heal(ctx context.Context) error {
	var errs []error
	for _, h := range l.order {
		if !l.touched[h.Name] {
			continue
		}
		const flush = "table netdev chaos\ndelete table netdev chaos\ntable ip filter\ndelete table ip filter\n"
		if _, err := h.runInput(ctx, []byte(flush), "nft", "-f", "-"); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(l.touched, h.Name)
	}
	clear(l.rules)
	for _, d := range l.delays {
		errs = append(errs, d.close())
	}
	l.delays = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netlab: heal: %w", err)
	}
	return nil
}

// Close removes everything the lab made: the delays and rules, the processes still in its
// namespaces (SIGKILL: stop them gracefully before), the veths, the namespaces and the
// bridge. A second call does nothing.
func (l *netLab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, d := range l.delays {
		errs = append(errs, d.close())
	}
	l.delays = nil
	for _, h := range l.order {
		errs = append(errs, removeNetHost(ctx, h.NS, h.veth))
	}
	if err := deleteLink(ctx, l.bridge); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netlab: close lab %s: %w", l.id, err)
	}
	return nil
}

// sets looks up the hosts of a and b, which must be non-empty and disjoint.
func (l *netLab) sets(a, b []string) ([]*netHost, []*netHost, error) {
	if l.closed {
		return nil, nil, errors.New("the lab is closed")
	}
	if len(a) == 0 || len(b) == 0 {
		return nil, nil, fmt.Errorf("hosts %v and %v: want two sets of hosts", a, b)
	}
	look := func(names []string) ([]*netHost, error) {
		var hs []*netHost
		for _, n := range names {
			h := l.hosts[n]
			if h == nil {
				return nil, fmt.Errorf("no host %s", n)
			}
			if slices.Contains(b, n) && slices.Contains(a, n) {
				return nil, fmt.Errorf("host %s is on both sides", n)
			}
			hs = append(hs, h)
		}
		return hs, nil
	}
	ha, err := look(a)
	if err != nil {
		return nil, nil, err
	}
	hb, err := look(b)
	if err != nil {
		return nil, nil, err
	}
	return ha, hb, nil
}

// rule is the rules of h's namespace.
func (l *netLab) rule(h *netHost) *nsRules {
	r := l.rules[h.Name]
	if r == nil {
		r = &nsRules{}
		l.rules[h.Name] = r
	}
	return r
}

// apply writes the table netdev chaos of each of hosts anew, in one nft transaction each.
func (l *netLab) apply(ctx context.Context, hosts []*netHost) error {
	var errs []error
	seen := map[string]bool{}
	for _, h := range hosts {
		if seen[h.Name] {
			continue
		}
		seen[h.Name] = true
		l.touched[h.Name] = true
		if _, err := h.runInput(ctx, []byte(renderRules(l.rules[h.Name])), "nft", "-f", "-"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// renderRules is the nft script that replaces a namespace's table netdev chaos with r. Its
// chains run at eth0, before the IP stack: a packet cut on its way in is not queued for a
// delay.
func renderRules(r *nsRules) string {
	var b strings.Builder
	b.WriteString("table netdev chaos\ndelete table netdev chaos\ntable netdev chaos {\n")
	for _, c := range []struct {
		hook  string
		rules []string
	}{{"ingress", r.ingress}, {"egress", r.egress}} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s device \"eth0\" priority filter; policy accept;\n", c.hook, c.hook)
		for _, rule := range c.rules {
			b.WriteString("\t\t" + rule + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// ipSet is the addresses of hosts as an nft anonymous set.
func ipSet(hosts []*netHost) string {
	return "{ " + strings.Join(hostIPs(hosts), ", ") + " }"
}

// ipList is the addresses of hosts as iptables takes them (comma-separated).
func ipList(hosts []*netHost) string { return strings.Join(hostIPs(hosts), ",") }

func hostIPs(hosts []*netHost) []string {
	ips := make([]string, len(hosts))
	for i, h := range hosts {
		ips[i] = h.IP
	}
	return ips
}

// sweepNetLabs removes what labs of runner processes that are no longer alive left behind:
// their namespaces (after killing what still runs in them), veths and bridges, recognised
// by their names (see the package's notes on the lab), which carry the creating process's
// pid. A SIGKILLed chaos run thus leaks nothing past the next lab. Labs of live processes,
// this one included, are left alone. Sweeps of concurrent runners take turns (a lock file).
func sweepNetLabs(ctx context.Context) error {
	unlock, err := lockFile(netLabLock)
	if err != nil {
		return fmt.Errorf("netlab: sweep: %w", err)
	}
	defer unlock()
	return sweepLocked(ctx)
}

// sweepLocked is sweepNetLabs with the lock file held.
func sweepLocked(ctx context.Context) error {
	var errs []error
	out, err := runInput(ctx, nil, "ip", "netns", "list")
	if err != nil {
		return fmt.Errorf("netlab: sweep: ip netns list: %w: %s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 && staleNetLabName(f[0], netnsPrefix) {
			errs = append(errs, removeNetHost(ctx, f[0], ""))
		}
	}
	// Files a namespace of a dead runner had (ip netns exec's /etc/netns/<ns>), also when the
	// namespace itself is gone.
	if entries, err := os.ReadDir(etcNetnsDir); err == nil {
		for _, e := range entries {
			if staleNetLabName(e.Name(), netnsPrefix) {
				errs = append(errs, os.RemoveAll(etcNetnsDir+"/"+e.Name()))
			}
		}
	}
	out, err = runInput(ctx, nil, "ip", "-o", "link", "show")
	if err != nil {
		return fmt.Errorf("netlab: sweep: ip link show: %w: %s", err, out)
	}
	// Veths before bridges; deleting one end of a veth pair deletes both.
	var veths, bridges []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		switch {
		case staleNetLabName(name, vethPrefix):
			veths = append(veths, name)
		case staleNetLabName(name, bridgePrefix):
			bridges = append(bridges, name)
		}
	}
	for _, name := range slices.Concat(veths, bridges) {
		errs = append(errs, deleteLink(ctx, name))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netlab: sweep: %w", err)
	}
	return nil
}

// staleNetLabName reports whether name is a lab's name with prefix whose creating process is
// gone.
func staleNetLabName(name, prefix string) bool {
	m := netLabName.FindStringSubmatch(name)
	if m == nil || m[1] != prefix {
		return false
	}
	pid, err := strconv.Atoi(m[2])
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return processGone(pid)
}

// processGone reports whether process pid has ended: there is none, or only its zombie (a
// SIGKILLed runner whose parent has not reaped it yet).
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// removeNetHost kills every process in the namespace ns, deletes veth (when not empty), the
// namespace and its files in /etc/netns/<ns> (which ip netns exec mounts over /etc for what
// it runs there: a hosts file, say). Parts already gone are not an error.
func removeNetHost(ctx context.Context, ns, veth string) error {
	var errs []error
	if err := killNetns(ctx, ns); err != nil {
		errs = append(errs, err)
	}
	if veth != "" {
		if err := deleteLink(ctx, veth); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(netnsDir + "/" + ns); err == nil {
		out, err := runInput(ctx, nil, "ip", "netns", "delete", ns)
		if _, serr := os.Stat(netnsDir + "/" + ns); err != nil && serr == nil {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w: %s", ns, err, out))
		}
	}
	if err := os.RemoveAll(etcNetnsDir + "/" + ns); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// deleteLink deletes the interface name; one that is not there is not an error.
func deleteLink(ctx context.Context, name string) error {
	if _, err := os.Stat("/sys/class/net/" + name); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out, err := runInput(ctx, nil, "ip", "link", "delete", name)
	if err != nil && !strings.Contains(string(out), "Cannot find device") {
		return fmt.Errorf("delete interface %s: %w: %s", name, err, out)
	}
	return nil
}

// killNetns SIGKILLs every process (but this one) in the namespace ns and waits until they
// are gone. A daemon that left its parent (epmd) would otherwise keep the namespace alive.
func killNetns(ctx context.Context, ns string) error {
	var st unix.Stat_t
	if err := unix.Stat(netnsDir+"/"+ns, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	pids := func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			var ps unix.Stat_t
			// A zombie has no namespace left: it does not count.
			if unix.Stat("/proc/"+e.Name()+"/ns/net", &ps) == nil && ps.Dev == st.Dev && ps.Ino == st.Ino {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		left := pids()
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("processes in namespace %s %v did not end: %w", ns, pids(), err)
	}
	return nil
}

// freeSubnet picks at random a 10.X.Y.0/24 that overlaps no address nor route of the
// machine.
func freeSubnet(ctx context.Context) (netip.Prefix, error) {
	var used []netip.Prefix
	addrs, err := runInput(ctx, nil, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip addr show: %w: %s", err, addrs)
	}
	for line := range strings.Lines(string(addrs)) {
		f := strings.Fields(line)
		if i := slices.Index(f, "inet"); i >= 0 && i+1 < len(f) {
			if p, err := netip.ParsePrefix(f[i+1]); err == nil {
				used = append(used, p.Masked())
			}
		}
	}
	routes, err := runInput(ctx, nil, "ip", "-4", "route", "show", "table", "all")
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip route show: %w: %s", err, routes)
	}
	for line := range strings.Lines(string(routes)) {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains(routeTypes, f[0]) {
			f = f[1:]
		}
		if len(f) == 0 || f[0] == "default" {
			continue
		}
		if !strings.Contains(f[0], "/") {
			f[0] += "/32"
		}
		if p, err := netip.ParsePrefix(f[0]); err == nil {
			used = append(used, p.Masked())
		}
	}
	for range 1000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + rand.IntN(155)), byte(rand.IntN(256)), 0}), 24)
		if !slices.ContainsFunc(used, p.Overlaps) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free 10.X.Y.0/24 for the lab")
}

// routeTypes are the words ip route show puts before a route's destination.
var routeTypes = []string{"unicast", "local", "broadcast", "multicast", "anycast", "nat",
	"unreachable", "blackhole", "prohibit", "throw"}

// lockFile takes an exclusive flock on path (created if need be) and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// runInput runs a command in the runner's namespace with stdin and returns its combined
// output.
func runInput(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return bytes.TrimSpace(out), err
}

// The NFQUEUE protocol (linux/netfilter/nfnetlink_queue.h), the little of it a delay needs.
const (
	nfnlSubsysQueue   = 3
	nfqnlMsgPacket    = nfnlSubsysQueue<<8 | 0
	nfqnlMsgVerdict   = nfnlSubsysQueue<<8 | 1
	nfqnlMsgConfig    = nfnlSubsysQueue<<8 | 2
	nfqaPacketHdr     = 1 // in a packet: struct nfqnl_msg_packet_hdr, the packet id first
	nfqaVerdictHdr    = 2 // in a verdict: struct nfqnl_msg_verdict_hdr
	nfqaCfgCmd        = 1 // struct nfqnl_msg_config_cmd
	nfqaCfgParams     = 2 // struct nfqnl_msg_config_params
	nfqaCfgQueueMaxln = 3
	nfqaCfgMask       = 4
	nfqaCfgFlags      = 5
	nfqnlCfgCmdBind   = 1
	nfqnlCopyMeta     = 1 // the packet's metadata alone, not its bytes
	nfqaCfgFGSO       = 1 << 2
	nfAccept          = 1
	nlaTypeMask       = 0x3fff
)

// nfqDelayer holds the packets of one NFQUEUE queue of one namespace for a delay each and
// then lets them through. Its netlink socket is opened in the namespace (a socket stays in
// the namespace it was opened in) and read by a goroutine of the runner, which keeps each
// packet's id with its deadline (delay plus a jitter of its own); a second goroutine gives
// the ACCEPT verdicts as the deadlines pass, out of order when jitters cross. The kernel
// gets the metadata alone and keeps the packets themselves.
type nfqDelayer struct {
	host          string
	queue         uint16
	delay, jitter time.Duration
	f             *os.File
	rc            syscall.RawConn

	mu       sync.Mutex
	held     heldPackets
	err      error         // the first failure of either goroutine
	kick     chan struct{} // a packet came in
	stop     chan struct{} // closed by close: let everything through and end
	readEnd  chan struct{} // closed when the reader ended
	relEnd   chan struct{} // closed when the releaser ended
	once     sync.Once
	closeErr error
}

// heldPacket is a packet's id and when to let it through.
type heldPacket struct {
	at time.Time
	id uint32
}

// heldPackets is a min-heap of held packets by deadline.
type heldPackets []heldPacket

func (h *heldPackets) push(p heldPacket) {
	*h = append(*h, p)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s[i].at.Before(s[parent].at) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *heldPackets) pop() heldPacket {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(s) && s[l].at.Before(s[small].at) {
			small = l
		}
		if r < len(s) && s[r].at.Before(s[small].at) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// startDelayer binds queue in h's namespace and starts holding its packets. The iptables
// rule that sends packets to the queue must come after it: a queue nobody listens to drops
// them.
func startDelayer(h *netHost, queue uint16, delay, jitter time.Duration) (*nfqDelayer, error) {
	fd := -1
	err := h.inNS(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: delay in %s: netfilter netlink socket: %w", h.Name, err)
	}
	if err := nfqBind(fd, queue); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("netlab: delay in %s: bind queue %d: %w", h.Name, queue, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("nfqueue-%s-%d", h.Name, queue))
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("netlab: delay in %s: %w", h.Name, err)
	}
	d := &nfqDelayer{
		host: h.Name, queue: queue, delay: delay, jitter: jitter, f: f, rc: rc,
		kick: make(chan struct{}, 1), stop: make(chan struct{}),
		readEnd: make(chan struct{}), relEnd: make(chan struct{}),
	}
	go d.read()
	go d.release()
	return d, nil
}

// nfqBind sets the socket up (a large receive buffer, no ENOBUFS errors: a packet the socket
// has no room for is dropped by the kernel, as a full queue would), binds queue to it, asks
// for the metadata alone and for GSO packets whole, and leaves the socket non-blocking.
func nfqBind(fd int, queue uint16) error {
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		return fmt.Errorf("receive buffer: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_NO_ENOBUFS, 1); err != nil {
		return fmt.Errorf("NETLINK_NO_ENOBUFS: %w", err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
		return fmt.Errorf("receive timeout: %w", err)
	}
	const seq = 1
	msg := nfqMessage(nfqnlMsgConfig, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, queue,
		nlAttr(nfqaCfgCmd, []byte{nfqnlCfgCmdBind, 0, 0, 0}),
		nlAttr(nfqaCfgParams, []byte{0, 0, 0, 0, nfqnlCopyMeta}),
		nlAttr(nfqaCfgQueueMaxln, be32(delayQueueLen)),
		nlAttr(nfqaCfgMask, be32(nfqaCfgFGSO)),
		nlAttr(nfqaCfgFlags, be32(nfqaCfgFGSO)),
	)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send config: %w", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("config answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("config answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != seq {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("config answer: short error message")
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return fmt.Errorf("config: %w", syscall.Errno(-code))
			}
			return unix.SetNonblock(fd, true)
		}
	}
}

// read takes the queue's packets in and holds each until its deadline.
func (d *nfqDelayer) read() {
	defer close(d.readEnd)
	buf := make([]byte, 1<<16)
	for {
		var n int
		var rerr error
		err := d.rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err != nil { // close set a deadline to stop us, or the file is closed
			return
		}
		if errors.Is(rerr, unix.EINTR) {
			continue
		}
		if rerr != nil {
			d.fail(fmt.Errorf("receive: %w", rerr))
			return
		}
		d.hold(buf[:n], time.Now(), false)
	}
}

// hold keeps the packets of the netlink messages in b, received at now, until their
// deadlines, or until now when at once is set.
func (d *nfqDelayer) hold(b []byte, now time.Time, atOnce bool) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		d.fail(fmt.Errorf("parse: %w", err))
		return
	}
	d.mu.Lock()
	for _, m := range msgs {
		switch m.Header.Type {
		case nfqnlMsgPacket:
			id, ok := nfqPacketID(m.Data)
			if !ok {
				continue
			}
			at := now
			if !atOnce {
				at = at.Add(d.delay)
				if d.jitter > 0 {
					at = at.Add(rand.N(d.jitter))
				}
			}
			d.held.push(heldPacket{at: at, id: id})
		case unix.NLMSG_ERROR:
			// A verdict the kernel refused (no such packet): it was dropped already.
			if len(m.Data) >= 4 && int32(binary.NativeEndian.Uint32(m.Data[:4])) != 0 && d.err == nil {
				d.err = fmt.Errorf("verdict refused: %w", syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4]))))
			}
		}
	}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// release gives the ACCEPT verdicts as the deadlines pass; once stopped, for every packet
// still held, at once.
func (d *nfqDelayer) release() {
	defer close(d.relEnd)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stopped := false
	for {
		d.mu.Lock()
		now := time.Now()
		var due []uint32
		for len(d.held) > 0 && (stopped || !d.held[0].at.After(now)) {
			due = append(due, d.held.pop().id)
		}
		wait := time.Duration(-1)
		if len(d.held) > 0 {
			wait = d.held[0].at.Sub(now)
		}
		d.mu.Unlock()
		if err := d.accept(due); err != nil {
			d.fail(err)
		}
		if stopped {
			return
		}
		if wait >= 0 {
			timer.Reset(wait)
		} else {
			timer.Stop()
		}
		select {
		case <-d.stop:
			stopped = true
		case <-d.kick:
		case <-timer.C:
		}
	}
}

// accept sends ACCEPT verdicts for ids, many to a datagram.
func (d *nfqDelayer) accept(ids []uint32) error {
	var buf []byte
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		var serr error
		err := d.rc.Write(func(fd uintptr) bool {
			serr = unix.Sendto(int(fd), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
			return !errors.Is(serr, unix.EAGAIN)
		})
		buf = buf[:0]
		if err = errors.Join(err, serr); err != nil {
			return fmt.Errorf("send verdicts: %w", err)
		}
		return nil
	}
	for _, id := range ids {
		verdict := append(be32(nfAccept), be32(id)...)
		buf = append(buf, nfqMessage(nfqnlMsgVerdict, unix.NLM_F_REQUEST, 0, d.queue, nlAttr(nfqaVerdictHdr, verdict))...)
		if len(buf) > 32<<10 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// fail keeps the first failure for close to report.
func (d *nfqDelayer) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
	}
}

// close stops the delay: the reader ends, the packets already in the socket are taken in,
// every held packet is let through at once, and the socket is closed (which unbinds the
// queue). Remove the rules that queue packets first, or the packets queued after close
// are dropped. A second call returns the first one's result.
func (d *nfqDelayer) close() error {
	d.once.Do(func() {
		_ = d.f.SetReadDeadline(time.Now())
		<-d.readEnd
		_ = d.rc.Control(func(fd uintptr) {
			buf := make([]byte, 1<<16)
			for {
				n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil {
					return
				}
				d.hold(buf[:n], time.Now(), true)
			}
		})
		close(d.stop)
		<-d.relEnd
		err := d.f.Close()
		d.mu.Lock()
		if d.err != nil && !errors.Is(d.err, syscall.ENOENT) {
			err = errors.Join(d.err, err)
		}
		d.mu.Unlock()
		if err != nil {
			d.closeErr = fmt.Errorf("netlab: delay in %s (queue %d): %w", d.host, d.queue, err)
		}
	})
	return d.closeErr
}

// nfqPacketID is the packet id of an NFQNL_MSG_PACKET's payload (after the netlink header).
func nfqPacketID(data []byte) (uint32, bool) {
	if len(data) < 4 {
		return 0, false
	}
	for b := data[4:]; len(b) >= 4; { // after struct nfgenmsg
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return 0, false
		}
		if binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask == nfqaPacketHdr && l >= 8 {
			return binary.BigEndian.Uint32(b[4:8]), true
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return 0, false
}

// nfqMessage is a netlink message of the queue subsystem for queue: header, struct nfgenmsg
// (AF_UNSPEC, version 0, the queue in network order), attributes.
func nfqMessage(typ, flags uint16, seq uint32, queue uint16, attrs ...[]byte) []byte {
	body := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(queue >> 8), byte(queue)}
	for _, a := range attrs {
		body = append(body, a...)
	}
	h := make([]byte, unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(h[0:4], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(h[4:6], typ)
	binary.NativeEndian.PutUint16(h[6:8], flags)
	binary.NativeEndian.PutUint32(h[8:12], seq)
	return append(h, body...)
}

// nlAttr is a netlink attribute, padded to 4 bytes.
func nlAttr(typ uint16, payload []byte) []byte {
	a := make([]byte, 4, nlAlign(4+len(payload)))
	binary.NativeEndian.PutUint16(a[0:2], uint16(4+len(payload)))
	binary.NativeEndian.PutUint16(a[2:4], typ)
	a = append(a, payload...)
	return append(a, make([]byte, nlAlign(len(a))-len(a))...)
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

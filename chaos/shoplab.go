package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ---- a shop on a network lab (ShopSpec.Network, local target) ----

// Host names of a shop on a network lab, besides its processes (each named as its Service)
// and its broker nodes (brokerHost): the partition faults name them (Target.Partition).
const (
	// HostOrdersPrimary is the orders database's primary, HostOrdersStandby its synchronous
	// standby, HostWarehouseDB the warehouse's database server.
	HostOrdersPrimary = string(OrdersDB)
	HostOrdersStandby = string(OrdersDBStandby)
	HostWarehouseDB   = string(WarehouseDB)
)

// brokerHost is the host name of the i-th broker node (from 1): also the host part of its
// Erlang node name, which the namespaces' hosts files resolve.
func brokerHost(i int) string { return fmt.Sprintf("broker-%d", i) }

// Settings of a broker cluster on a network lab.
const (
	// labNetTicktime is the nodes' net_ticktime: a node that hears nothing from a peer for
	// between 0.75 and 1.25 of it takes the peer for gone. RabbitMQ's default is 60s; a
	// partition scenario must outlast it, so the lab's is shorter.
	labNetTicktime = 10 * time.Second
	// labClusterConf is the nodes' rabbitmq.conf beyond the target's: a node in a minority
	// pauses (closes its clients' connections and stops listening) until it sees a majority
	// again, the documented partition handling for quorum queues.
	labClusterConf = "cluster_partition_handling = pause_minority\n"
)

// shopLab is the current shop's network lab: a namespace on one bridge for each broker node,
// each database server and each service process, which the partition faults cut apart.
type shopLab struct {
	net *netLab
	// warehouse is the warehouse's database server, in the lab (the target's own is on
	// 127.0.0.1, which the namespaces cannot reach).
	warehouse *pgServer
	// nodes maps the broker's Erlang node names to their hosts.
	nodes map[string]string

	// mu serialises the lab's faults with the record of them: a Promote must never believe
	// a cut that a concurrent heal undid.
	mu sync.Mutex
	// cut holds the pairs of hosts {from, to} whose packets Partition drops, until
	// HealPartitions.
	cut map[[2]string]bool
}

// startShopLab creates the lab and a host for each of names, and gives every namespace a
// hosts file that names the broker nodes.
func startShopLab(ctx context.Context, id string, names []string) (*shopLab, error) {
	if missing := MissingNetworkTools(); len(missing) > 0 {
		return nil, fmt.Errorf("a shop on a network lab needs %s", strings.Join(missing, ", "))
	}
	lab, err := newNetLab(ctx, id)
	if err != nil {
		return nil, err
	}
	s := &shopLab{net: lab, nodes: map[string]string{}}
	for _, name := range names {
		if _, err := lab.AddHost(ctx, name); err != nil {
			return s, err
		}
	}
	machine, err := os.ReadFile("/etc/hosts")
	if err != nil {
		return s, fmt.Errorf("network lab: %w", err)
	}
	var hosts strings.Builder
	hosts.Write(machine)
	hosts.WriteString("\n# the chaos network lab's broker nodes\n")
	for i := 1; i <= clusterSize; i++ {
		if h := lab.Host(brokerHost(i)); h != nil {
			fmt.Fprintf(&hosts, "%s %s\n", h.IP, brokerHost(i))
		}
	}
	// ip netns exec mounts /etc/netns/<ns>/hosts over /etc/hosts for what it runs; the lab
	// removes the directory with the namespace.
	for _, name := range names {
		dir := filepath.Join(etcNetnsDir, lab.Host(name).NS)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return s, fmt.Errorf("network lab: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			return s, fmt.Errorf("network lab: %w", err)
		}
	}
	return s, nil
}

// host returns the lab host of name, or an error naming the hosts there are.
func (s *shopLab) host(name string) (*netHost, error) {
	if h := s.net.Host(name); h != nil {
		return h, nil
	}
	return nil, fmt.Errorf("no host %q in the network lab", name)
}

// resolve maps the names a scenario gives (processes, database servers, broker nodes by
// host or by Erlang node name) to lab host names.
func (s *shopLab) resolve(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if h, ok := s.nodes[n]; ok {
			n = h
		}
		if _, err := s.host(n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// resolveBoth resolves two sets of names.
func (s *shopLab) resolveBoth(a, b []string) ([]string, []string, error) {
	ha, err := s.resolve(a)
	if err != nil {
		return nil, nil, err
	}
	hb, err := s.resolve(b)
	if err != nil {
		return nil, nil, err
	}
	return ha, hb, nil
}

// close stops the lab's warehouse server, and removes the lab and the hosts files.
func (s *shopLab) close(ctx context.Context) error {
	var errs []error
	if s.warehouse != nil {
		errs = append(errs, s.warehouse.kill(ctx), os.RemoveAll(s.warehouse.dir))
	}
	errs = append(errs, s.net.Close())
	return errors.Join(errs...)
}

// shopLab is the current shop's lab, or an error when the shop has none.
func (l *Local) shopLab() (*shopLab, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop == nil || l.shop.lab == nil {
		return nil, fmt.Errorf("the shop is not on a network lab (ShopSpec.Network): %w", ErrUnsupported)
	}
	return l.shop.lab, nil
}

// Partition implements Target.
func (l *Local) Partition(ctx context.Context, a, b []string, bothWays bool) error {
	lab, err := l.shopLab()
	if err != nil {
		return err
	}
	ha, hb, err := lab.resolveBoth(a, b)
	if err != nil {
		return err
	}
	if len(ha) == 0 || len(hb) == 0 || slices.ContainsFunc(ha, func(h string) bool { return slices.Contains(hb, h) }) {
		return fmt.Errorf("partition %v from %v: two sets of hosts, none in both", a, b)
	}
	lab.mu.Lock()
	defer lab.mu.Unlock()
	// Recorded only once in effect: a cut half made is not one to promote on.
	if err := lab.net.Partition(ctx, ha, hb, bothWays); err != nil {
		return err
	}
	if lab.cut == nil {
		lab.cut = map[[2]string]bool{}
	}
	for _, x := range ha {
		for _, y := range hb {
			lab.cut[[2]string{x, y}] = true
			if bothWays {
				lab.cut[[2]string{y, x}] = true
			}
		}
	}
	return nil
}

// DegradeNetwork implements Target.
func (l *Local) DegradeNetwork(ctx context.Context, a, b []string, lossPercent int, delay, jitter time.Duration) error {
	lab, err := l.shopLab()
	if err != nil {
		return err
	}
	ha, hb, err := lab.resolveBoth(a, b)
	if err != nil {
		return err
	}
	if lossPercent > 0 {
		if err := lab.net.Loss(ctx, ha, hb, lossPercent); err != nil {
			return err
		}
	}
	if delay > 0 || jitter > 0 {
		return lab.net.Delay(ctx, ha, hb, delay, jitter)
	}
	return nil
}

// HealPartitions implements Target.
func (l *Local) HealPartitions(ctx context.Context) error {
	lab, err := l.shopLab()
	if err != nil {
		return err
	}
	lab.mu.Lock()
	defer lab.mu.Unlock()
	// Forgotten first: a heal that fails half-way leaves no cut to promote on.
	lab.cut = nil
	return lab.net.Heal(ctx)
}

// primaryCutOff reports whether the orders primary is cut, both ways, from its standby and
// from every process of the shop on its lab: then the standby may be promoted with the
// primary running, as a failover manager that no longer hears the primary would, and no
// process can write to the old primary meanwhile. A primary cut from its standby alone is
// not enough: the processes would go on writing to it.
func (l *Local) primaryCutOff() bool {
	lab, err := l.shopLab()
	if err != nil {
		return false
	}
	l.mu.Lock()
	peers := []string{HostOrdersStandby}
	if l.shop != nil {
		for _, s := range l.shop.order {
			peers = append(peers, string(s))
		}
	}
	l.mu.Unlock()
	return lab.cutOff(HostOrdersPrimary, peers)
}

// cutOff reports whether host is cut from every one of peers, both ways.
func (s *shopLab) cutOff(host string, peers []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range peers {
		if !s.cut[[2]string{host, p}] || !s.cut[[2]string{p, host}] {
			return false
		}
	}
	return true
}

// place puts a database server, once initialised, on the lab host name.
func (s *shopLab) place(pg *pgServer, name string) error {
	h, err := s.host(name)
	if err != nil {
		return err
	}
	return pg.onLab(h, s.net.Subnet())
}

// MissingNetworkTools lists what a shop on a network lab needs and this machine lacks: root
// (namespaces, and the servers' users entered after them), ip (iproute2), nft (nftables),
// iptables-nft (Debian's iptables, for delays) and setpriv (util-linux).
func MissingNetworkTools() []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"ip", "nft", "iptables-nft", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	return missing
}

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- the three-node RabbitMQ cluster (local target) ----

// clusterSize is the number of nodes of a shop's broker cluster: a quorum queue on three
// nodes survives the loss of one.
const clusterSize = 3

// rabbitCluster is a shop's private RabbitMQ cluster: nodes of the local target's kind
// (rabbitServer), sharing an Erlang cookie of their own, the second and third joined to the
// first with rabbitmqctl join_cluster.
type rabbitCluster struct {
	dir   string
	nodes []*rabbitServer
}

// startRabbitCluster starts the nodes in parallel (most of a node's start is its VM
// booting) and joins them to the first one at a time (joins in parallel race in the schema
// database). The cluster is returned also on error, for remove.
//
// On a network lab (lab not nil), node i runs on the lab host brokerHost(i), in its
// namespace on its own address, with standard ports and an epmd of its own, named
// rabbit@broker-<i>; the nodes pause a minority (labClusterConf) and give up on a
// silent peer after labNetTicktime.
func startRabbitCluster(ctx context.Context, dir, prefix string, lab *shopLab) (*rabbitCluster, error) {
	c := &rabbitCluster{dir: dir}
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	cookie := strings.ToUpper(hex.EncodeToString(b))
	for i := 1; i <= clusterSize; i++ {
		name := fmt.Sprintf("%sn%d@localhost", prefix, i)
		host := brokerHost(i)
		if lab != nil {
			// A namespace of its own, an epmd of its own: no other node to tell it from.
			name = "rabbit@" + host
		}
		n, err := newRabbitServer(name, filepath.Join(dir, "n"+strconv.Itoa(i)))
		if err != nil {
			return c, err
		}
		if lab != nil {
			h, err := lab.host(host)
			if err != nil {
				return c, err
			}
			n.ns, n.ip = h.NS, h.IP
			n.port, n.distPort = 5672, 25672
			n.conf = labClusterConf + fmt.Sprintf("net_ticktime = %d\n", int(labNetTicktime.Seconds()))
			lab.nodes[n.node] = host
		}
		c.nodes = append(c.nodes, n)
		if err := n.init(); err != nil {
			return c, err
		}
		// The node's HOME is its directory: the cookie there is the VM's.
		p := filepath.Join(n.dir, ".erlang.cookie")
		if err := os.WriteFile(p, []byte(cookie), 0o400); err != nil {
			return c, fmt.Errorf("rabbitmq: %w", err)
		}
		if err := n.acct.chown(p); err != nil {
			return c, fmt.Errorf("rabbitmq: %w", err)
		}
	}
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = n.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	for _, n := range c.nodes[1:] {
		jctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].node}, {"start_app"}} {
			if _, err := n.ctl(jctx, args...); err != nil {
				cancel()
				return c, fmt.Errorf("rabbitmq: join %s to the cluster: %w", n.node, err)
			}
		}
		err := n.waitAMQP(jctx)
		cancel()
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// URLs are the nodes' AMQP URLs, in node order.
func (c *rabbitCluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return urls
}

// names are the nodes' Erlang node names, in node order.
func (c *rabbitCluster) names() []string {
	names := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		names[i] = n.node
	}
	return names
}

// node returns the node named name.
func (c *rabbitCluster) node(name string) (*rabbitServer, error) {
	for _, n := range c.nodes {
		if n.node == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no broker node %q in the cluster (%s)", name, strings.Join(c.names(), ", "))
}

// clientName finds the client-provided connection name in rabbitmqctl's JSON of a
// connection's client_properties, whichever shape it takes (a map, or a list of
// name/type/value triples).
var clientName = regexp.MustCompile(`"connection_name"\s*[:,]\s*(?:"longstr"\s*,\s*)?"([^"]*)"`)

// state asks a running node which node leads which quorum queue, which clients are connected
// to which node, and which nodes run and were partitioned from which (three rabbitmqctl
// calls, a second or so each). A node that does not answer (paused in a minority, say) is
// passed over for the next.
func (c *rabbitCluster) state(ctx context.Context) ([]BrokerNodeState, error) {
	var errs []error
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		states, err := c.stateFrom(ctx, n)
		if err == nil {
			return states, nil
		}
		errs = append(errs, fmt.Errorf("asking %s: %w", n.node, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no node of the cluster is running")
	}
	return nil, errors.Join(errs...)
}

// stateFrom is state, as the node asked sees it.
func (c *rabbitCluster) stateFrom(ctx context.Context, asked *rabbitServer) ([]BrokerNodeState, error) {
	// Each call starts an Erlang VM of its own, seconds of it waiting: the three at once.
	calls := [][]string{
		{"cluster_status", "--formatter", "json"},
		{"list_queues", "--formatter", "json", "name", "type", "leader"},
		// 3.10 has no node column (and its JSON shows a pid without the node's name): the
		// connection's name, "client address -> node address", gives the node's address.
		{"list_connections", "--formatter", "json", "name", "client_properties"},
	}
	outs := make([]string, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, args := range calls {
		wg.Go(func() { outs[i], errs[i] = asked.ctl(ctx, args...) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var status struct {
		RunningNodes []string        `json:"running_nodes"`
		Partitions   json.RawMessage `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(outs[0]), &status); err != nil {
		return nil, fmt.Errorf("rabbitmqctl cluster_status: %w: %s", err, outs[0])
	}
	// {"node": ["peer", …]} when there were partitions; [] or {} when none.
	partitions := map[string][]string{}
	_ = json.Unmarshal(status.Partitions, &partitions)
	var queues []struct{ Name, Type, Leader string }
	if err := json.Unmarshal([]byte(outs[1]), &queues); err != nil {
		return nil, fmt.Errorf("rabbitmqctl list_queues: %w: %s", err, outs[1])
	}
	var conns []struct {
		Name             string
		ClientProperties json.RawMessage `json:"client_properties"`
	}
	if err := json.Unmarshal([]byte(outs[2]), &conns); err != nil {
		return nil, fmt.Errorf("rabbitmqctl list_connections: %w: %s", err, outs[2])
	}
	states := make([]BrokerNodeState, len(c.nodes))
	for i, n := range c.nodes {
		states[i].Node = n.node
		states[i].Running = slices.Contains(status.RunningNodes, n.node)
		states[i].PartitionedFrom = slices.Sorted(slices.Values(partitions[n.node]))
		for _, q := range queues {
			if q.Type == "quorum" && q.Leader == n.node {
				states[i].Leads = append(states[i].Leads, q.Name)
			}
		}
		for _, cn := range conns {
			if _, server, _ := strings.Cut(cn.Name, "->"); strings.TrimSpace(server) != n.addr() {
				continue
			}
			name := "(unnamed)"
			if m := clientName.FindSubmatch(cn.ClientProperties); m != nil {
				name = string(m[1])
			}
			states[i].Clients = append(states[i].Clients, name)
		}
		slices.Sort(states[i].Leads)
		slices.Sort(states[i].Clients)
	}
	return states, nil
}

// remove kills every node and deletes the cluster's directories.
func (c *rabbitCluster) remove(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = n.kill(ctx) })
	}
	wg.Wait()
	return errors.Join(append(errs, os.RemoveAll(c.dir))...)
}

// brokerCluster is the current shop's cluster, nil when its broker is the single node.
func (l *Local) brokerCluster() (*rabbitCluster, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop == nil || l.shop.cluster == nil {
		return nil, fmt.Errorf("the shop's broker is one node: %w", ErrUnsupported)
	}
	return l.shop.cluster, nil
}

// KillBrokerNode implements Target.
func (l *Local) KillBrokerNode(ctx context.Context, node string) error {
	c, err := l.brokerCluster()
	if err != nil {
		return err
	}
	n, err := c.node(node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return n.kill(ctx)
}

// RestartBrokerNode implements Target: the node starts on its directories and rejoins the
// cluster by itself.
func (l *Local) RestartBrokerNode(ctx context.Context, node string) error {
	c, err := l.brokerCluster()
	if err != nil {
		return err
	}
	n, err := c.node(node)
	if err != nil {
		return err
	}
	// A SIGKILLed node leaves its pid file behind.
	_ = os.Remove(filepath.Join(n.dir, "pid"))
	return n.start(ctx)
}

// BrokerClusterState implements Target.
func (l *Local) BrokerClusterState(ctx context.Context) ([]BrokerNodeState, error) {
	c, err := l.brokerCluster()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return c.state(ctx)
}

// ---- the scenario ----

// Names the scenario looks for in the cluster's state.
const (
	// ordersQueue is the queue of the orders' events, which the warehouse consumes: the work
	// queue whose leader dies first.
	ordersQueue = "warehouse.orders"
	// inboxClientPrefix starts the connection name of every inbox consumer.
	inboxClientPrefix = "outboxshop inbox "
)

// Bounds and timings of broker-node-kill.
const (
	// nodeKillResumeBound is how soon after a node's death orders must complete again: a new
	// leader is elected in well under a second, the clients reconnect after their backoff.
	nodeKillResumeBound = 20 * time.Second
	// nodeKillDown is the shortest time a killed node stays down: the clients and the
	// queues must carry on without it, not wait for it.
	nodeKillDown = 5 * time.Second
	// nodeKillLoad is the scenario's least load: room for two kills, each with its recovery
	// and the restart of the killed node, on a quiet machine. Each reading of the cluster's
	// state costs three rabbitmqctl calls, at once (5 to 10s on a quiet two-core machine, 40s on a
	// loaded one), and a restart 10 to 30s (50s loaded): the load then goes on until
	// nodeKillLoadAfter after the second restart.
	nodeKillLoad = 70 * time.Second
	// nodeKillLoadAfter is how long the load goes on after the second node's restart (or
	// after 70s, whichever is later): orders through the whole cluster again.
	nodeKillLoadAfter = 5 * time.Second
)

// firstCompletionAfter is when the first order placed after $1 completed (NULL: none yet).
const firstCompletionAfter = `
SELECT min(h.at) FROM order_status_history h JOIN orders o ON o.id = h.order_id
WHERE h.message_id IS NOT NULL AND o.created_at > $1`

// ordersCreatedBetween counts the orders the API took in [$1, $2).
const ordersCreatedBetween = `SELECT count(*) FROM orders WHERE created_at >= $1 AND created_at < $2`

// nodeKill is what broker-node-kill's Inject learns and its Check verifies.
type nodeKill struct {
	mu sync.Mutex
	// moved are the clients that were connected to the second node killed.
	moved []string
}

func brokerNodeKillScenario() Scenario {
	k := &nodeKill{}
	return Scenario{
		Name: "broker-node-kill",
		Summary: "a three-node RabbitMQ cluster: the node leading the work queue's quorum SIGKILLed mid-load, then a node a relay and " +
			"a consumer are connected to; the clients move to the other nodes, orders keep completing, nothing lost or applied twice",
		BrokerCluster: true,
		MinLoad:       nodeKillLoad,
		// The second kill follows the first node's restart: on a slow machine it came after
		// a fixed load's end, with no order placed to complete.
		LoadAfterInject: nodeKillLoadAfter,
		Inject:          k.inject,
		Check:           checks(checkNoDeaths, k.check),
	}
}

func init() { register(brokerNodeKillScenario()) }

func (k *nodeKill) inject(ctx context.Context, e *Env) error {
	k.mu.Lock()
	k.moved = nil
	k.mu.Unlock()
	if len(e.Endpoints.BrokerNodes) != clusterSize {
		return fmt.Errorf("the broker is not a cluster of %d nodes (%d nodes)", clusterSize, len(e.Endpoints.BrokerNodes))
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !e.AtLoad(ctx, time.Second) {
		return ctx.Err()
	}

	// 1. The leader of the orders' work queue.
	states, err := e.Target.BrokerClusterState(ctx)
	if err != nil {
		return fmt.Errorf("read the cluster's state: %w", err)
	}
	e.Saw("cluster before the first kill: %s", describeCluster(states))
	leader := leaderOf(states, ordersQueue)
	if leader == "" {
		return fmt.Errorf("no node leads %s: %s", ordersQueue, describeCluster(states))
	}
	if err := k.killAndRecover(ctx, e, conn, leader, "leader of "+ordersQueue); err != nil {
		return err
	}

	// 2. A node that a relay and a consumer are connected to, now that they moved away from
	// the first one. The first node is back first: with two of three down, the queues have
	// no majority.
	states, err = e.Target.BrokerClusterState(ctx)
	if err != nil {
		return fmt.Errorf("read the cluster's state: %w", err)
	}
	e.Saw("cluster before the second kill: %s", describeCluster(states))
	target, clients := pickClientNode(states)
	if target == "" {
		return fmt.Errorf("no node has a shop client: %s", describeCluster(states))
	}
	if !hasRelayAndConsumer(clients) {
		// The clients pick their node from a random start: a relay and a consumer may share
		// none (one run in eight, the relays on one node and the consumers on the other). The
		// node with the most of them is killed instead, and the report says so.
		e.Saw("no node had both a relay and a consumer connected; the node with the most shop clients is killed instead")
	}
	k.mu.Lock()
	k.moved = clients
	k.mu.Unlock()
	return k.killAndRecover(ctx, e, conn, target, "serving "+strings.Join(clients, ", "))
}

// killAndRecover SIGKILLs node, waits until an order completes after the kill, and starts
// the node again.
func (k *nodeKill) killAndRecover(ctx context.Context, e *Env, conn *pgx.Conn, node, role string) error {
	if err := e.Target.KillBrokerNode(ctx, node); err != nil {
		return fmt.Errorf("kill broker node %s: %w", node, err)
	}
	killedAt := time.Now()
	e.Fault(killedAt, "RabbitMQ node %s (%s) SIGKILLed", node, role)
	cpu := e.outageStarts(ctx, "node "+node+" was down")

	// Orders in flight at the kill may complete at once: the evidence is an order placed
	// after it.
	var resumed *time.Time
	wctx, cancel := context.WithTimeout(ctx, nodeKillResumeBound)
	err := poll(wctx, 200*time.Millisecond, func() (bool, error) {
		err := conn.QueryRow(wctx, firstCompletionAfter, killedAt).Scan(&resumed)
		return err == nil && resumed != nil, nil
	})
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		e.Fail("no order completed within %s of the kill of node %s", nodeKillResumeBound, node)
	} else {
		e.Saw("an order placed after the kill of node %s completed %.1fs after it", node, resumed.Sub(killedAt).Seconds())
	}
	if !sleepCtx(ctx, time.Until(killedAt.Add(nodeKillDown))) {
		return ctx.Err()
	}

	restartAt := time.Now()
	if err := e.Target.RestartBrokerNode(ctx, node); err != nil {
		return fmt.Errorf("restart broker node %s: %w", node, err)
	}
	e.outageEnds(ctx, cpu)
	var taken int
	if err := conn.QueryRow(ctx, ordersCreatedBetween, killedAt, restartAt).Scan(&taken); err != nil {
		return fmt.Errorf("count the orders taken during the outage: %w", err)
	}
	e.Healed("node %s restarted (down %.1fs, back in %.1fs); the API took %d orders while it was down",
		node, restartAt.Sub(killedAt).Seconds(), time.Since(restartAt).Seconds(), taken)
	// The load goes on until the inject returned (LoadAfterInject): orders were placed.
	if taken == 0 {
		e.Fail("the API took no order while node %s was down", node)
	}
	return nil
}

// leaderOf is the node that leads the quorum queue queue, "" if none does.
func leaderOf(states []BrokerNodeState, queue string) string {
	for _, s := range states {
		if slices.Contains(s.Leads, queue) {
			return s.Node
		}
	}
	return ""
}

// pickClientNode returns the node with a relay and a consumer connected to it, the one with
// the most of both if several, else the one with the most shop clients; and those clients.
func pickClientNode(states []BrokerNodeState) (string, []string) {
	best, bestScore, bestClients := "", 0, []string(nil)
	for _, s := range states {
		var shop []string
		for _, c := range s.Clients {
			if isRelay(c) || strings.HasPrefix(c, inboxClientPrefix) {
				shop = append(shop, c)
			}
		}
		score := len(shop)
		if hasRelayAndConsumer(shop) {
			score += 100
		}
		if score > bestScore {
			best, bestScore, bestClients = s.Node, score, shop
		}
	}
	return best, bestClients
}

func isRelay(client string) bool {
	return client == string(OrdersRelay) || client == string(WarehouseRelay)
}

func hasRelayAndConsumer(clients []string) bool {
	relay := slices.ContainsFunc(clients, isRelay)
	consumer := slices.ContainsFunc(clients, func(c string) bool { return strings.HasPrefix(c, inboxClientPrefix) })
	return relay && consumer
}

// describeCluster says, per node, what it leads and who is connected.
func describeCluster(states []BrokerNodeState) string {
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = fmt.Sprintf("%s leads [%s], serves [%s]", s.Node, strings.Join(s.Leads, " "), strings.Join(s.Clients, ", "))
		if !s.Running {
			parts[i] += " (not running)"
		}
		if len(s.PartitionedFrom) > 0 {
			parts[i] += ", partitioned from [" + strings.Join(s.PartitionedFrom, " ") + "]"
		}
	}
	return strings.Join(parts, "; ")
}

// check requires the clients of the second node killed connected again, each to another
// node, with the killed nodes back in the cluster.
func (k *nodeKill) check(ctx context.Context, e *Env, o *Outcome) {
	k.mu.Lock()
	moved := k.moved
	k.mu.Unlock()
	if len(moved) == 0 {
		return // inject failed, and said why
	}
	states, err := e.Target.BrokerClusterState(ctx)
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("read the cluster's state: %v", err))
		return
	}
	e.Saw("cluster at the end: %s", describeCluster(states))
	var all []string
	for _, s := range states {
		all = append(all, s.Clients...)
	}
	for _, c := range moved {
		if !slices.Contains(all, c) {
			o.Failures = append(o.Failures, fmt.Sprintf("%s, connected to the second node killed, is connected to no node at the end", c))
		}
	}
}

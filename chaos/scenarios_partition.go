package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- network partitions, on a network lab (ShopSpec.Network) ----

// Bounds and timings of the partition scenarios.
const (
	// minorityPauseBound is how soon after the cut the node in the minority must pause:
	// its peers go silent, it notices within 1.25 net_ticktimes, and pause_minority stops
	// its listeners.
	minorityPauseBound = labNetTicktime*5/4 + 20*time.Second
	// partitionResumeBound is how soon after a fault's effect (the minority paused, the
	// clients moved) an order placed after it must complete: the clients notice, reconnect
	// elsewhere after their backoff (a consumer's grows to 30s while every node it tries
	// refuses, the paused one among them), and carry on.
	partitionResumeBound = 60 * time.Second
	// minorityCutLeast is the least time the minority stays cut off: longer than
	// net_ticktime, as a partition the cluster must notice.
	minorityCutLeast = 2 * labNetTicktime
	// rejoinBound is how soon after the heal the paused node must run again in the cluster.
	rejoinBound = 90 * time.Second
	// clientMoveBound is how soon the clients cut from their node must be connected to
	// another: a silent connection is noticed after three heartbeat intervals without a
	// frame (amqp091-go's read deadline: 30s at the shop's 10s heartbeat), sooner by a
	// relay whose publish waits for its confirm; then the clients reconnect after their
	// backoff, perhaps trying the cut node first (its dial timeout).
	clientMoveBound = 90 * time.Second
	// isolatedResumeBound is how soon after the promotion an order placed after it must
	// complete, the old primary still cut off: every process's statements and LISTEN on it
	// give up after the dead-peer timeout (10s, internal/pgdb), then connect to the new
	// primary, the old one's address taking the connect timeout first.
	isolatedResumeBound = 45 * time.Second
	// isolatedAlone is how long the orders primary is cut off before its standby is
	// promoted: what a failover manager takes to decide.
	isolatedAlone = 3 * time.Second
	// isolatedAfterPromotion is how long the old primary stays cut off, still running, after
	// the promotion, and unfencedAfterHeal how long it runs healed, before the failover
	// manager fences it (SIGKILL, as a STONITH would).
	isolatedAfterPromotion = 8 * time.Second
	unfencedAfterHeal      = 5 * time.Second
	// flakyFor is how long flaky-network degrades the links, and flakyStep how often it
	// draws new figures for them.
	flakyFor  = 60 * time.Second
	flakyStep = 10 * time.Second
	// partitionLoad is the partition scenarios' least load.
	partitionLoad = 40 * time.Second
)

// partitionLoadAfter is how long the load of a partition scenario goes on after its
// Inject returned: orders through the healed network.
const partitionLoadAfter = 5 * time.Second

// nodeAddr is the AMQP address (host:port) of the broker node named node, from the
// endpoints' URLs, which are in the order of the node names.
func nodeAddr(eps Endpoints, node string) (string, error) {
	i := slices.Index(eps.BrokerNodes, node)
	if i < 0 || i >= len(eps.AMQPURLs) {
		return "", fmt.Errorf("no URL for broker node %s", node)
	}
	u, err := url.Parse(eps.AMQPURLs[i])
	if err != nil {
		return "", fmt.Errorf("broker node %s: %w", node, err)
	}
	return u.Host, nil
}

// clientProcess is the shop process that opened a broker connection of the given
// client-provided name: a relay names itself after its process, an inbox consumer after its
// service ("outboxshop inbox warehouse"), whose consumer runs in the service's API process.
func clientProcess(client string) (Service, bool) {
	switch {
	case isRelay(client):
		return Service(client), true
	case client == inboxClientPrefix+"warehouse":
		return Warehouse, true
	case client == inboxClientPrefix+"orders":
		return OrdersAPI, true
	}
	return "", false
}

// awaitCompletionAfter waits, up to bound, until an order placed after at completes, and
// says so; a miss is a failure of the scenario, not of its fault.
func awaitCompletionAfter(ctx context.Context, e *Env, conn *pgx.Conn, at time.Time, bound time.Duration, what string) {
	var resumed *time.Time
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := poll(wctx, 200*time.Millisecond, func() (bool, error) {
		err := conn.QueryRow(wctx, firstCompletionAfter, at).Scan(&resumed)
		return err == nil && resumed != nil, nil
	})
	switch {
	case ctx.Err() != nil:
	case err != nil:
		e.Fail("no order placed after %s completed within %s", what, bound)
	default:
		e.Saw("an order placed after %s completed %.1fs after it", what, resumed.Sub(at).Seconds())
	}
}

// ---- broker-minority-partition ----

// minority is what broker-minority-partition's Inject learns and its Check verifies.
type minority struct {
	mu     sync.Mutex
	leader string
}

func brokerMinorityPartitionScenario() Scenario {
	m := &minority{}
	return Scenario{
		Name: "broker-minority-partition",
		Summary: "on a network lab, the RabbitMQ node leading the work queue cut from the other two (both ways) for longer than " +
			"net_ticktime: it pauses (pause_minority) and closes its clients' connections, they move to the majority, which " +
			"elects new leaders and keeps confirming; healed, the node rejoins; nothing lost or applied twice",
		Network:         true,
		MinLoad:         partitionLoad,
		LoadAfterInject: partitionLoadAfter,
		Inject:          m.inject,
		Check:           checks(checkNoDeaths, checkEveryConfirmedConsumed, m.check),
	}
}

// beforeBrokerCut opens a connection to the orders database, waits until 2s into the load,
// and reads the cluster's state, as the broker partitions start; the caller closes conn.
func beforeBrokerCut(ctx context.Context, e *Env) (*pgx.Conn, []BrokerNodeState, error) {
	if len(e.Endpoints.BrokerNodes) != clusterSize {
		return nil, nil, fmt.Errorf("the broker is not a cluster of %d nodes (%d nodes)", clusterSize, len(e.Endpoints.BrokerNodes))
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the orders database: %w", err)
	}
	if !e.AtLoad(ctx, 2*time.Second) {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, nil, ctx.Err()
	}
	states, err := e.Target.BrokerClusterState(ctx)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("read the cluster's state: %w", err)
	}
	e.Saw("cluster before the cut: %s", describeCluster(states))
	return conn, states, nil
}

func (m *minority) inject(ctx context.Context, e *Env) error {
	conn, states, err := beforeBrokerCut(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	leader := leaderOf(states, ordersQueue)
	if leader == "" {
		return fmt.Errorf("no node leads %s: %s", ordersQueue, describeCluster(states))
	}
	m.mu.Lock()
	m.leader = leader
	m.mu.Unlock()
	others := slices.DeleteFunc(slices.Clone(e.Endpoints.BrokerNodes), func(n string) bool { return n == leader })
	addr, err := nodeAddr(e.Endpoints, leader)
	if err != nil {
		return err
	}

	if err := e.Target.Partition(ctx, []string{leader}, others, true); err != nil {
		return fmt.Errorf("cut %s from %s: %w", leader, strings.Join(others, ", "), err)
	}
	cutAt := time.Now()
	e.Fault(cutAt, "RabbitMQ node %s (leader of %s) cut from %s, both ways", leader, ordersQueue, strings.Join(others, " and "))
	healed := false
	defer func() {
		if !healed {
			_ = e.Target.HealPartitions(context.WithoutCancel(ctx))
		}
	}()
	cpu := e.outageStarts(ctx, "node "+leader+" was cut off")

	// The minority pauses: it stops listening, which the runner (never cut) sees as a
	// refusal, three times in a row (a timeout on a busy machine is no evidence).
	refusals := 0
	pctx, cancel := context.WithTimeout(ctx, minorityPauseBound)
	err = poll(pctx, 250*time.Millisecond, func() (bool, error) {
		if tcpRefuses(addr) {
			refusals++
		} else {
			refusals = 0
		}
		return refusals >= 3, nil
	})
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("node %s, cut off, did not pause within %s (pause_minority): it still accepts connections", leader, minorityPauseBound)
	}
	pausedAt := time.Now()
	e.Saw("node %s paused (refused connections) %.1fs after the cut", leader, pausedAt.Sub(cutAt).Seconds())
	awaitCompletionAfter(ctx, e, conn, pausedAt, partitionResumeBound, "node "+leader+" paused")

	// The majority's view: the minority is not running, no client and no leader is on it.
	if states, err := e.Target.BrokerClusterState(ctx); err != nil {
		e.Fail("read the cluster's state during the partition: %v", err)
	} else {
		e.Saw("cluster during the partition: %s", describeCluster(states))
		for _, s := range states {
			if s.Node != leader {
				continue
			}
			if s.Running {
				e.Fail("the majority reports node %s running during the partition", leader)
			}
			if len(s.Leads) > 0 {
				e.Fail("node %s, paused, still leads %s in the majority's view", leader, strings.Join(s.Leads, ", "))
			}
		}
	}
	if !sleepCtx(ctx, time.Until(cutAt.Add(minorityCutLeast))) {
		return ctx.Err()
	}

	if err := e.Target.HealPartitions(ctx); err != nil {
		return fmt.Errorf("heal the partition: %w", err)
	}
	healed = true
	healedAt := time.Now()
	e.outageEnds(ctx, cpu)
	// The node resumes by itself once it sees a majority again, and rejoins.
	var last []BrokerNodeState
	rctx, cancel := context.WithTimeout(ctx, rejoinBound)
	// Every reading of the state starts three Erlang VMs: not too often, on a machine whose
	// nodes must keep their ticks.
	err = poll(rctx, 3*time.Second, func() (bool, error) {
		if !tcpAnswers(addr) {
			return false, nil
		}
		states, err := e.Target.BrokerClusterState(rctx)
		if err != nil {
			return false, nil
		}
		last = states
		return !slices.ContainsFunc(states, func(s BrokerNodeState) bool { return !s.Running }), nil
	})
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("node %s did not rejoin within %s of the heal: %s", leader, rejoinBound, describeCluster(last))
	}
	e.Healed("partition healed after %.1fs; node %s rejoined %.1fs later: %s",
		healedAt.Sub(cutAt).Seconds(), leader, time.Since(healedAt).Seconds(), describeCluster(last))
	return nil
}

// check requires every shop client connected at the end, with the cluster whole.
func (m *minority) check(ctx context.Context, e *Env, o *Outcome) {
	m.mu.Lock()
	leader := m.leader
	m.mu.Unlock()
	if leader == "" {
		return // inject failed, and said why
	}
	checkShopClientsConnected(ctx, e, o)
}

// checkShopClientsConnected fails the scenario unless every relay and inbox consumer of the
// shop is connected to a node at the end.
func checkShopClientsConnected(ctx context.Context, e *Env, o *Outcome) {
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
	for _, c := range []string{string(OrdersRelay), string(WarehouseRelay), inboxClientPrefix + "warehouse", inboxClientPrefix + "orders"} {
		if !slices.Contains(all, c) {
			o.Failures = append(o.Failures, fmt.Sprintf("%s is connected to no node at the end", c))
		}
	}
}

// ---- broker-client-partition ----

// clientCut is what broker-client-partition's Inject learns and its Check verifies.
type clientCut struct {
	mu    sync.Mutex
	moved []string
}

func brokerClientPartitionScenario() Scenario {
	c := &clientCut{}
	return Scenario{
		Name: "broker-client-partition",
		Summary: "on a network lab, a relay and a consumer cut from the RabbitMQ node they are connected to (both ways), the node " +
			"still in the cluster: their connections go silent; they notice by heartbeats and move to another node, the node " +
			"requeues what the consumer had not acknowledged; nothing lost or applied twice",
		Network:         true,
		OutsideCI:       true,
		MinLoad:         partitionLoad,
		LoadAfterInject: partitionLoadAfter,
		Inject:          c.inject,
		Check:           checks(checkNoDeaths, checkEveryConfirmedConsumed, c.check),
	}
}

func (c *clientCut) inject(ctx context.Context, e *Env) error {
	conn, states, err := beforeBrokerCut(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	node, clients := pickClientNode(states)
	if node == "" {
		return fmt.Errorf("no node has a shop client: %s", describeCluster(states))
	}
	var procs []string
	for _, cl := range clients {
		if p, ok := clientProcess(cl); ok && !slices.Contains(procs, string(p)) {
			procs = append(procs, string(p))
		}
	}
	if !hasRelayAndConsumer(clients) {
		e.Saw("no node had both a relay and a consumer connected; the clients of the node with the most are cut instead")
	}
	c.mu.Lock()
	c.moved = clients
	c.mu.Unlock()

	if err := e.Target.Partition(ctx, procs, []string{node}, true); err != nil {
		return fmt.Errorf("cut %s from node %s: %w", strings.Join(procs, ", "), node, err)
	}
	cutAt := time.Now()
	e.Fault(cutAt, "%s (clients %s) cut from RabbitMQ node %s, both ways; the node stays in the cluster",
		strings.Join(procs, " and "), strings.Join(clients, ", "), node)
	healed := false
	defer func() {
		if !healed {
			_ = e.Target.HealPartitions(context.WithoutCancel(ctx))
		}
	}()
	cpu := e.outageStarts(ctx, "clients were cut from node "+node)

	// Each client connected to another node: the old connection may still be listed on the
	// cut node until its heartbeat timeout closes it.
	var last []BrokerNodeState
	mctx, cancel := context.WithTimeout(ctx, clientMoveBound)
	err = poll(mctx, time.Second, func() (bool, error) {
		states, err := e.Target.BrokerClusterState(mctx)
		if err != nil {
			return false, nil
		}
		last = states
		for _, cl := range clients {
			if !slices.ContainsFunc(states, func(s BrokerNodeState) bool { return s.Node != node && slices.Contains(s.Clients, cl) }) {
				return false, nil
			}
		}
		return true, nil
	})
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("the clients cut from node %s did not all connect to another node within %s: %s", node, clientMoveBound, describeCluster(last))
	}
	movedAt := time.Now()
	e.Saw("every client cut from node %s connected to another node %.1fs after the cut: %s", node, movedAt.Sub(cutAt).Seconds(), describeCluster(last))
	awaitCompletionAfter(ctx, e, conn, movedAt, partitionResumeBound, "the clients moved")

	if err := e.Target.HealPartitions(ctx); err != nil {
		return fmt.Errorf("heal the partition: %w", err)
	}
	healed = true
	e.outageEnds(ctx, cpu)
	e.Healed("partition healed after %.1fs", time.Since(cutAt).Seconds())
	return nil
}

func (c *clientCut) check(ctx context.Context, e *Env, o *Outcome) {
	c.mu.Lock()
	moved := c.moved
	c.mu.Unlock()
	if len(moved) == 0 {
		return // inject failed, and said why
	}
	checkShopClientsConnected(ctx, e, o)
}

// ---- pg-primary-isolated ----

// isolated is what pg-primary-isolated's Inject learns and its Check verifies.
type isolated struct {
	// wal: the orders relay is the WAL relay, whose stream must give up on the silent
	// primary too, and create its slot again on the new one.
	wal      bool
	mu       sync.Mutex
	promoted bool
	// cutAt and promotedAt bound the time no order could be committed anywhere: the primary
	// unreachable, the standby read-only.
	cutAt, promotedAt time.Time
	// probe says what a write on the old primary, healed but not yet fenced, came to.
	probe string
}

// probeWrite is a write on the old primary as the shop's commits make one: a record in the
// WAL (as outbox.CommitReplicated's barrier writes), so that the COMMIT waits for the
// synchronous standby, which no longer follows it.
const probeWrite = `SELECT pg_logical_emit_message(true, 'chaos.fence-probe', '')`

// isolatedProbeTimeout bounds the probe's commit: the shop's own requests give up sooner.
const isolatedProbeTimeout = 3 * time.Second

func pgPrimaryIsolatedScenario() Scenario {
	p := &isolated{}
	return Scenario{
		Name: "pg-primary-isolated",
		Summary: "on a network lab, the orders PostgreSQL primary cut from its synchronous standby and from every process (both " +
			"ways), still running; the standby promoted; healed, the old primary takes no write anyone is told of (its synchronous " +
			"standby follows another primary) until the failover manager fences it; every 201 survives, nothing lost",
		Network:         true,
		RecordAnswers:   true,
		MinLoad:         partitionLoad,
		LoadAfterInject: partitionLoadAfter,
		Inject:          p.inject,
		Check:           checks(checkNoDeaths, checkEveryConfirmedConsumed, p.check),
	}
}

// pgPrimaryIsolatedWALScenario is pg-primary-isolated with the orders relay on the WAL
// relay: its replication stream, silent once the primary is cut off, must be given up on
// (every status asks the server for a reply) and follow the failover.
func pgPrimaryIsolatedWALScenario() Scenario {
	p := &isolated{wal: true}
	sc := pgPrimaryIsolatedScenario()
	sc.Name = "pg-primary-isolated-wal"
	sc.Summary = "pg-primary-isolated with the orders WAL relay: its stream from the silent primary is given up on after 10s, " +
		"its slot created again on the new primary, the rows pending then published through its retry lane; nothing lost"
	sc.Settings = []string{"ORDERS_RELAY_MODE=" + relayModeWAL}
	sc.OutsideCI = true
	sc.Inject, sc.Check = p.inject, checks(checkNoDeaths, checkEveryConfirmedConsumed, p.check)
	return sc
}

func (p *isolated) inject(ctx context.Context, e *Env) error {
	p.mu.Lock()
	p.promoted, p.probe, p.cutAt, p.promotedAt = false, "", time.Time{}, time.Time{}
	p.mu.Unlock()
	if len(e.Endpoints.OrdersDBServers) != 2 {
		return fmt.Errorf("the orders database has no standby (%d servers)", len(e.Endpoints.OrdersDBServers))
	}
	primaryURL, standbyURL := e.Endpoints.OrdersDBServers[0], e.Endpoints.OrdersDBServers[1]
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	procs := make([]string, len(e.processes))
	for i, s := range e.processes {
		procs[i] = string(s)
	}
	if err := e.Target.Partition(ctx, []string{HostOrdersPrimary}, append([]string{HostOrdersStandby}, procs...), true); err != nil {
		return fmt.Errorf("cut the orders primary off: %w", err)
	}
	cutAt := time.Now()
	e.Fault(cutAt, "orders PostgreSQL primary cut from its standby and from every process, both ways; it keeps running")
	healed, fenced := false, false
	defer func() {
		if !healed {
			_ = e.Target.HealPartitions(context.WithoutCancel(ctx))
		}
	}()
	cpu := e.outageStarts(ctx, "the orders primary was cut off")

	// Meanwhile the API's sessions on the primary are silent and the standby takes no write:
	// no order can be committed anywhere (Check reads the answers of that time).
	if !sleepCtx(ctx, isolatedAlone) {
		return ctx.Err()
	}
	if err := e.Target.Promote(ctx, OrdersDB); err != nil {
		return fmt.Errorf("promote the standby: %w", err)
	}
	promotedAt := time.Now()
	// From here two servers take writes: whatever ends the inject, the old primary is fenced
	// before the network heals (this defer runs before the heal's).
	defer func() {
		if !fenced {
			_ = e.Target.Kill(context.WithoutCancel(ctx), OrdersDB)
		}
	}()
	p.mu.Lock()
	p.promoted, p.cutAt, p.promotedAt = true, cutAt, promotedAt
	p.mu.Unlock()
	e.Saw("standby promoted %.1fs after the cut, the old primary still running", promotedAt.Sub(cutAt).Seconds())
	nconn, err := openDB(ctx, standbyURL)
	if err != nil {
		return fmt.Errorf("connect to the new primary: %w", err)
	}
	defer nconn.Close(context.WithoutCancel(ctx))
	awaitCompletionAfter(ctx, e, nconn, promotedAt, isolatedResumeBound, "the promotion")
	if !sleepCtx(ctx, time.Until(promotedAt.Add(isolatedAfterPromotion))) {
		return ctx.Err()
	}

	// Healed, not fenced: two servers take writes. The old one cannot tell anyone a write
	// succeeded: its commits wait for a standby that follows the new primary now.
	if err := e.Target.HealPartitions(ctx); err != nil {
		return fmt.Errorf("heal the partition: %w", err)
	}
	healed = true
	healedAt := time.Now()
	e.outageEnds(ctx, cpu)
	e.Healed("partition healed %.1fs after the cut; the old primary runs unfenced", healedAt.Sub(cutAt).Seconds())
	probe := probeOldPrimary(ctx, primaryURL)
	p.mu.Lock()
	p.probe = probe
	p.mu.Unlock()
	e.Saw("a write on the old primary, healed and not fenced: %s", probe)
	if !sleepCtx(ctx, time.Until(healedAt.Add(unfencedAfterHeal))) {
		return ctx.Err()
	}
	if err := e.Target.Kill(ctx, OrdersDB); err != nil {
		return fmt.Errorf("fence the old primary: %w", err)
	}
	fenced = true
	e.Healed("old primary fenced (SIGKILLed) %.1fs after the heal, as the failover manager's STONITH would", time.Since(healedAt).Seconds())
	return nil
}

// probeOldPrimary writes on the old primary, as the shop does (the replication barrier,
// then COMMIT), with a bound on the commit, and says what came of it.
func probeOldPrimary(ctx context.Context, primaryURL string) string {
	conn, err := openDB(ctx, primaryURL)
	if err != nil {
		return "no connection: " + err.Error()
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var recovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovery); err != nil {
		return "pg_is_in_recovery: " + err.Error()
	}
	pctx, cancel := context.WithTimeout(ctx, isolatedProbeTimeout)
	defer cancel()
	tx, err := conn.Begin(pctx)
	if err != nil {
		return "begin: " + err.Error()
	}
	if _, err := tx.Exec(pctx, probeWrite); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Sprintf("in recovery %t; refused: %v", recovery, err)
	}
	err = tx.Commit(pctx)
	switch {
	case err == nil && pctx.Err() == nil:
		return fmt.Sprintf("in recovery %t; ACKNOWLEDGED", recovery)
	case err == nil:
		return fmt.Sprintf("in recovery %t; the commit returned only once cut short after %s: not acknowledged", recovery, isolatedProbeTimeout)
	default:
		return fmt.Sprintf("in recovery %t; not acknowledged within %s (%v)", recovery, isolatedProbeTimeout, err)
	}
}

func (p *isolated) check(ctx context.Context, e *Env, o *Outcome) {
	p.mu.Lock()
	promoted, probe, cutAt, promotedAt := p.promoted, p.probe, p.cutAt, p.promotedAt
	p.mu.Unlock()
	if !promoted {
		return // inject failed, and said why
	}
	// An order committed just before the cut may be answered just after it; from a second
	// after the cut to the promotion, nothing could commit.
	from := cutAt.Add(time.Second)
	codes := map[int]int{}
	for _, a := range e.Answers.all() {
		if a.inFlight() || a.Answered.Before(from) || !a.Answered.Before(promotedAt) {
			continue
		}
		codes[a.Status]++
		if a.Status == http.StatusCreated || a.Status == http.StatusOK {
			o.Failures = append(o.Failures, fmt.Sprintf("the API answered %d to %s %.1fs after the cut, before the promotion: "+
				"no server could commit it", a.Status, a.Key, a.Answered.Sub(cutAt).Seconds()))
		}
	}
	answered := formatCodes(codes)
	if len(codes) == 0 {
		answered = "none: every request waited"
	}
	e.Saw("answers to the load from 1s after the cut to the promotion: %s", answered)
	if strings.Contains(probe, "ACKNOWLEDGED") {
		o.Failures = append(o.Failures, "the old primary, healed and not fenced, acknowledged a write: "+probe)
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDBServers[1])
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("connect to the new primary: %v", err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	checkFollowedFailover(ctx, e, conn, p.wal, func(format string, args ...any) {
		o.Failures = append(o.Failures, fmt.Sprintf(format, args...))
	})
}

// ---- flaky-network ----

// flaky is what flaky-network's Inject learns.
type flaky struct {
	mu    sync.Mutex
	steps []string
}

func flakyNetworkScenario() Scenario {
	f := &flaky{}
	return Scenario{
		Name: "flaky-network",
		Summary: "on a network lab, the links between the services and the three RabbitMQ nodes lose 5–20% of their packets and " +
			"hold each 50–200ms, both ways, redrawn every 10s for a minute: connections stall, time out and come back; " +
			"nothing lost or applied twice",
		Network:         true,
		OutsideCI:       true,
		MinLoad:         flakyFor + 10*time.Second,
		LoadAfterInject: partitionLoadAfter,
		Inject:          f.inject,
		Check:           checks(checkNoDeaths, checkEveryConfirmedConsumed, func(ctx context.Context, e *Env, o *Outcome) { checkShopClientsConnected(ctx, e, o) }),
	}
}

func (f *flaky) inject(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	procs := make([]string, len(e.processes))
	for i, s := range e.processes {
		procs[i] = string(s)
	}
	nodes := e.Endpoints.BrokerNodes
	start := time.Now()
	healed := false
	defer func() {
		if !healed {
			_ = e.Target.HealPartitions(context.WithoutCancel(ctx))
		}
	}()
	cpu := e.outageStarts(ctx, "the network was flaky")
	for i := 0; time.Since(start) < flakyFor; i++ {
		loss := 5 + mrand.IntN(16)
		delay := time.Duration(50+mrand.IntN(151)) * time.Millisecond
		if i > 0 {
			if err := e.Target.HealPartitions(ctx); err != nil {
				return fmt.Errorf("heal the network: %w", err)
			}
		}
		if err := e.Target.DegradeNetwork(ctx, procs, nodes, loss, delay, 0); err != nil {
			return fmt.Errorf("degrade the network: %w", err)
		}
		step := fmt.Sprintf("%d%% loss, %s delay", loss, delay)
		f.mu.Lock()
		f.steps = append(f.steps, step)
		f.mu.Unlock()
		if i == 0 {
			e.Fault(time.Now(), "links between the services and the broker nodes degraded: %s, both ways (redrawn every %s)", step, flakyStep)
		}
		if !sleepCtx(ctx, min(flakyStep, flakyFor-time.Since(start))) {
			return ctx.Err()
		}
	}
	if err := e.Target.HealPartitions(ctx); err != nil {
		return fmt.Errorf("heal the network: %w", err)
	}
	healed = true
	e.outageEnds(ctx, cpu)
	f.mu.Lock()
	steps := strings.Join(f.steps, "; ")
	f.mu.Unlock()
	e.Healed("network whole again after %.0fs (%s)", time.Since(start).Seconds(), steps)
	return nil
}

func init() {
	register(brokerMinorityPartitionScenario(), brokerClientPartitionScenario(), pgPrimaryIsolatedScenario(),
		pgPrimaryIsolatedWALScenario(), flakyNetworkScenario())
}

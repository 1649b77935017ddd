package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Service is one process of the shop, named as the services of docker-compose.yml.
type Service string

// The four processes of the shop, one per role.
const (
	// Warehouse is `warehouse api`: the stock API and the consumer of the orders' events.
	Warehouse Service = "warehouse"
	// WarehouseRelay is `warehouse relay`: the warehouse's outbox relay.
	WarehouseRelay Service = "warehouse-relay"
	// OrdersAPI is `orders api`: the orders API and the consumer of the stock events.
	OrdersAPI Service = "orders-api"
	// OrdersRelay is `orders relay`: the orders' outbox relay.
	OrdersRelay Service = "orders-relay"
)

// Services lists the processes in the order they start: each service declares the queue it
// consumes, so the consumers come up before the relays publish to them.
var Services = []Service{Warehouse, OrdersAPI, WarehouseRelay, OrdersRelay}

// consumers are the services that run an inbox consumer (and export inbox_duplicates_total).
var consumers = []Service{Warehouse, OrdersAPI}

// Component is a piece of infrastructure a scenario can kill and restart.
type Component string

// The components.
const (
	// Broker is the RabbitMQ node.
	Broker Component = "rabbitmq"
	// OrdersDB is the orders service's PostgreSQL (the local target runs one per service;
	// docker compose runs one for both).
	OrdersDB Component = "orders-db"
	// WarehouseDB is the warehouse's PostgreSQL (local target only: docker compose runs one
	// server for both services, so it cannot take the warehouse's down alone).
	WarehouseDB Component = "warehouse-db"
	// OrdersDBStandby is the synchronous standby of the orders database, when it has one
	// (ShopSpec.OrdersStandby; local target only): Kill takes it away, and the primary's
	// commits then wait for it; Restart starts it again as a standby, streaming from the
	// primary if it can reach one.
	OrdersDBStandby Component = "orders-db-standby"
)

// Replica names the n-th process of svc when a shop runs more than one (n from 2):
// "orders-relay-2". Replica(svc, 1) is svc itself.
func Replica(svc Service, n int) Service {
	if n <= 1 {
		return svc
	}
	return Service(fmt.Sprintf("%s-%d", svc, n))
}

// ShopSpec is what a scenario asks of a fresh shop.
type ShopSpec struct {
	// Name identifies the scenario; targets derive database names from it.
	Name string
	// Failpoints arms crash points in a service's first incarnation: CHAOS_FAILPOINTS of that
	// process, e.g. "relay.after-publish=kill@40". A restarted process runs without them.
	Failpoints map[Service]string
	// Settings are environment variables ("WAREHOUSE_QUEUE_DELIVERY_LIMIT=3") given to every
	// service process on top of the target's own; each service reads those of its prefix.
	Settings []string
	// Replicas asks for more than one process of a service (2 runs svc and
	// Replica(svc, 2)). Only the local target supports it.
	Replicas map[Service]int
	// ProcessSettings are environment variables of one process (a replica, say) on top of
	// Settings: two replicas of a service can so run two relays. Only the local target
	// supports it.
	ProcessSettings map[Service][]string
	// OrdersStandby puts the orders database on a primary with a synchronous streaming
	// standby, and gives the orders processes both addresses (a multi-host URL with
	// target_session_attrs=read-write): Kill(OrdersDB) then kills the primary, and
	// Promote(OrdersDB) promotes the standby. Only the local target supports it.
	OrdersStandby bool
	// BrokerCluster runs the broker as a cluster of three nodes (quorum queues replicated on
	// all three) and gives every service process the three nodes' URLs: KillBrokerNode and
	// RestartBrokerNode then act on one node. Only the local target supports it.
	BrokerCluster bool
	// Network runs every server and process of the shop in a network namespace of its own,
	// on one bridge (a network lab): the broker as a three-node cluster that pauses a
	// minority (BrokerCluster is implied), the orders database on a primary and a
	// synchronous standby (OrdersStandby is implied), the warehouse's database, and each
	// service process. Partition and DegradeNetwork then act on them. Only the local target
	// supports it, as root, and not with TLS.
	Network bool
	// TLS runs the shop on servers of its own that take TLS alone and ask every client for a
	// certificate of their private CA: every process gets amqps:// and sslmode=verify-full
	// URLs and the CA and client certificate as settings (*_AMQP_CA_FILE, *_DATABASE_CA_FILE
	// and the others), and the runner's own clients connect over TLS too (Endpoints). Only
	// the local target supports it, and not with OrdersStandby or BrokerCluster.
	TLS bool
}

// Processes lists the shop's processes in start order: the four services, then the extra
// replicas.
func (s ShopSpec) Processes() []Service {
	out := slices.Clone(Services)
	for _, svc := range Services {
		for n := 2; n <= s.Replicas[svc]; n++ {
			out = append(out, Replica(svc, n))
		}
	}
	return out
}

// Stopped says how a service process ended when the runner stopped it.
type Stopped struct {
	Service Service
	// Took is the time from SIGTERM to the process's exit.
	Took time.Duration
	// Killed is set when it did not exit within the grace and was SIGKILLed.
	Killed bool
	// Status is the exit status as text ("exit status 0").
	Status string
}

// Clean reports a stop without SIGKILL and with exit status 0.
func (s Stopped) Clean() bool { return !s.Killed && s.Status == "exit status 0" }

// Endpoints is how the runner reaches a running shop.
type Endpoints struct {
	// OrdersURL and StockURL are the two HTTP APIs (http://127.0.0.1:port).
	OrdersURL, StockURL string
	// OrdersDB and WarehouseDB are PostgreSQL URLs of the two services' databases (over TLS,
	// with sslrootcert, sslcert and sslkey, when the shop runs on TLS).
	OrdersDB, WarehouseDB string
	// AMQPURL reaches the broker directly, around any fault the target puts in the network:
	// the runner's observer queue and poison messages use it. When the shop runs on TLS, it
	// is amqps:// with the CA and client certificate as parameters (cacertfile, certfile,
	// keyfile), which amqp091-go reads.
	AMQPURL string
	// AdminToken is the warehouse's admin token, which PUT /stock/{sku} requires
	// (Authorization: Bearer): the runner sets the stock with it.
	AdminToken string
	// Metrics is where each service serves /metrics.
	Metrics map[Service]string
	// OrdersDBServers are the URLs of the orders database on each server alone, the primary
	// first, when it has a standby (ShopSpec.OrdersStandby); empty otherwise.
	OrdersDBServers []string
	// AMQPURLs are the URLs of every node when the broker is a cluster (ShopSpec.BrokerCluster),
	// in the order of BrokerNodes; empty otherwise. AMQPURL is then the first of them.
	AMQPURLs []string
	// BrokerNodes are the cluster's Erlang node names ("chaos123n1@localhost"); empty
	// without a cluster.
	BrokerNodes []string
}

// BrokerNodeState is what one node of a broker cluster does, as the cluster reports it.
type BrokerNodeState struct {
	// Node is the Erlang node name.
	Node string
	// Leads lists the quorum queues the node leads.
	Leads []string
	// Clients lists the client-provided names of the connections to the node
	// ("orders-relay", "outboxshop inbox warehouse"…).
	Clients []string
	// Running says whether the node runs the broker, in the view of the node asked (a node
	// that paused in a minority, or that is down, does not).
	Running bool
	// PartitionedFrom lists the nodes that this node reports it was partitioned from
	// (rabbitmqctl cluster_status: partitions), as the node asked knows it.
	PartitionedFrom []string
}

// Death is a service process that ended without the runner asking.
type Death struct {
	Service Service
	// Incarnation counts the process's starts, from 1.
	Incarnation int
	At          time.Time
	// Killed reports death by SIGKILL: what a crash point does.
	Killed bool
	// Status is the exit status or signal as text ("signal: killed", "exit status 1").
	Status string
	// CrashPoints are the names of the crash points armed in the incarnation
	// (CHAOS_FAILPOINTS); none in an incarnation after a restart.
	CrashPoints []string
}

// Cause says how the process ended, as a report shows it: "killed by its crash point
// relay.after-publish (signal: killed)", "ended by itself (exit status 1)". A crash point
// kills its process with SIGKILL and writes nothing first, so a SIGKILL of an incarnation with
// crash points armed is taken for theirs: nothing else of a run SIGKILLs a process it wants
// up.
func (d Death) Cause() string {
	switch {
	case d.Killed && len(d.CrashPoints) == 1:
		return fmt.Sprintf("killed by its crash point %s (%s)", d.CrashPoints[0], d.Status)
	case d.Killed && len(d.CrashPoints) > 1:
		return fmt.Sprintf("killed by one of its crash points %s (%s)", strings.Join(d.CrashPoints, ", "), d.Status)
	case d.Killed:
		return fmt.Sprintf("killed by a SIGKILL, no crash point armed (%s)", d.Status)
	default:
		return fmt.Sprintf("ended by itself (%s)", d.Status)
	}
}

// crashPointNames returns the names of the crash points of a CHAOS_FAILPOINTS value
// ("relay.after-publish=kill@30,relay.after-mark=kill" gives both names), none for "".
func crashPointNames(spec string) []string {
	var names []string
	for entry := range strings.SplitSeq(spec, ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(entry), "="); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// ProcessCPU is the CPU time (user and system) a service process has used since it started.
type ProcessCPU struct {
	// Incarnation counts the process's starts, from 1: readings of two incarnations cannot
	// be compared.
	Incarnation int
	Used        time.Duration
}

// NetworkStats says what a network fault did.
type NetworkStats struct {
	// Cut counts broker connections dropped by cuts; Refused, connections refused meanwhile.
	Cut, Refused int64
	// Delayed counts chunks of data held back by delays.
	Delayed int64
}

// ErrUnsupported is returned by a target for a fault it cannot inject.
var ErrUnsupported = errors.New("not supported by this target")

// Target runs the shop somewhere and breaks it on request. The runner calls Prepare once,
// then StartShop and StopShop around every scenario, and Close at the end (also after a
// failure or an interrupt).
type Target interface {
	// Name is the target's name ("local", "compose").
	Name() string
	// Prepare builds what the scenarios share (binaries, database servers, the broker).
	// progress receives a line per step.
	Prepare(ctx context.Context, progress func(string)) error
	// StartShop starts the four services on fresh databases and a broker without any of the
	// shop's queues, and returns once every one of them is ready.
	StartShop(ctx context.Context, spec ShopSpec) (Endpoints, error)
	// WaitDeath waits until svc ended without the runner asking (a crash point fired) and
	// says how. It returns ctx's error when that did not happen in time.
	WaitDeath(ctx context.Context, svc Service) (Death, error)
	// Heal brings svc back, without its crash points, if it is down, and waits until it is
	// ready again.
	Heal(ctx context.Context, svc Service) error
	// Deaths lists every death in the current shop so far.
	Deaths() []Death
	// Kill kills a component without warning (SIGKILL) and returns once it is gone.
	Kill(ctx context.Context, c Component) error
	// Restart starts a killed component again and returns once it answers: after a crash,
	// PostgreSQL recovers what its WAL holds. The primary of a database with a standby may
	// be restarted only until the standby is promoted (two primaries would split the brain).
	Restart(ctx context.Context, c Component) error
	// Promote makes the standby of a database component its primary (pg_ctl promote) and
	// returns once it takes writes.
	Promote(ctx context.Context, c Component) error
	// KillBrokerNode SIGKILLs one node of the broker cluster (ShopSpec.BrokerCluster) and
	// returns once it is gone; RestartBrokerNode starts it again and returns once it accepts
	// connections. BrokerClusterState asks a running node which node leads which queue and
	// which clients are connected where.
	KillBrokerNode(ctx context.Context, node string) error
	RestartBrokerNode(ctx context.Context, node string) error
	BrokerClusterState(ctx context.Context) ([]BrokerNodeState, error)
	// CutNetwork drops the services' broker connections and refuses new ones until
	// HealNetwork; DelayNetwork holds every chunk between them and the broker for d.
	CutNetwork(ctx context.Context) error
	DelayNetwork(ctx context.Context, d time.Duration) error
	HealNetwork(ctx context.Context) error
	// NetworkStats says what the network faults of the current shop did.
	NetworkStats() NetworkStats
	// Partition cuts the hosts a from the hosts b on a shop on a network lab
	// (ShopSpec.Network): every packet from a host of a to a host of b is dropped, and with
	// bothWays every packet back too, silently, as a broken link would (connections stall;
	// nothing resets them). Hosts are the shop's processes (Service names), its database
	// servers (HostOrdersPrimary, HostOrdersStandby, HostWarehouseDB) and its broker nodes
	// (their Erlang names, as Endpoints.BrokerNodes gives them). The runner itself is
	// never cut. DegradeNetwork drops lossPercent of the packets between them, both ways,
	// and holds each for delay plus up to jitter. HealPartitions undoes both.
	Partition(ctx context.Context, a, b []string, bothWays bool) error
	DegradeNetwork(ctx context.Context, a, b []string, lossPercent int, delay, jitter time.Duration) error
	HealPartitions(ctx context.Context) error
	// Pause stops svc's process without ending it (SIGSTOP, or the container frozen): it
	// keeps its connections, locks and transactions, and does nothing. Resume lets it go on.
	Pause(ctx context.Context, svc Service) error
	Resume(ctx context.Context, svc Service) error
	// StopService stops svc gracefully (SIGTERM, SIGKILL after grace) and says how it ended;
	// the supervisor does not restart it. StartService starts it again, without crash points,
	// and waits until it is ready: together, one step of a rolling deploy.
	StopService(ctx context.Context, svc Service, grace time.Duration) (Stopped, error)
	StartService(ctx context.Context, svc Service) error
	// Configure sets environment variables for svc's next incarnations, after the shop's
	// (a new setting shipped with a deploy): the next StartService or restart uses them.
	// The running incarnation keeps what it started with.
	Configure(svc Service, settings ...string) error
	// Exec runs svc's binary with args and svc's environment (its settings and Configure's)
	// as an operator would in its container, and returns what it wrote on stdout; its stderr
	// is in the error when it fails.
	Exec(ctx context.Context, svc Service, args ...string) ([]byte, error)
	// BrokerAlarm raises (on) or clears a memory alarm on the broker: with the alarm, the
	// broker stops reading from every connection that publishes. It returns once the alarm
	// is in effect, or gone. BrokerAlarms lists the broker's alarms as it reports them.
	BrokerAlarm(ctx context.Context, on bool) error
	BrokerAlarms(ctx context.Context) (string, error)
	// CPUTime says how much CPU svc's current incarnation has used so far; ErrUnsupported
	// where the target cannot tell.
	CPUTime(ctx context.Context, svc Service) (ProcessCPU, error)
	// Logs returns everything svc wrote in the current shop, all incarnations.
	Logs(ctx context.Context, svc Service) (string, error)
	// ComponentLogs returns what a component (a database server, the broker) logged since
	// the current shop started, as far as the target can tell.
	ComponentLogs(ctx context.Context, c Component) (string, error)
	// StopShop stops the services and deletes the shop's data.
	StopShop(ctx context.Context) error
	// Close stops and deletes everything the target started.
	Close() error
}

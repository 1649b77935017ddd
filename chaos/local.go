package chaos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/chaos/internal/proxy"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// LocalConfig configures [NewLocal].
type LocalConfig struct {
	// RepoDir is the root of the outboxshop repository (where go.work is). Default: found
	// from the working directory upwards.
	RepoDir string
	// RunDir holds the binaries, the servers' data and every log. Default: a new directory
	// under os.TempDir(), removed by Close unless Keep is set.
	RunDir string
	// Keep leaves RunDir in place after Close, for inspection.
	Keep bool
	// RestartDelay is how long the supervisor waits before restarting a process that died.
	// Default 500ms.
	RestartDelay time.Duration
	// Logger receives debug lines. nil discards.
	Logger *slog.Logger
}

// Local is the target that CI runs: it builds the two service binaries, starts two private
// PostgreSQL servers (one per service) and a private RabbitMQ node on spare ports, and runs
// the four service processes under a supervisor. Every service reaches the broker through a
// TCP proxy of the runner's, which network faults cut and slow down.
type Local struct {
	cfg    LocalConfig
	log    *slog.Logger
	runDir string
	made   bool // runDir was created by us

	bins                map[string]string
	ordersPG, warehouse *pgServer
	rabbit              *rabbitServer
	brokerProxy         *proxy.Proxy
	closeOnce           sync.Once
	mu                  sync.Mutex
	shop                *localShop
	netBase             proxy.Stats // proxy counters when the current shop started
}

// localShop is one scenario's set of processes and databases.
type localShop struct {
	spec        ShopSpec
	ordersDB    string
	warehouseDB string
	dir         string
	procs       map[Service]*process
	order       []Service           // the processes in start order
	logStart    map[Component]int64 // size of each server's log when the shop started
	// ordersPair is the orders database's primary and standby when the shop asked for a
	// standby (ShopSpec.OrdersStandby); nil otherwise.
	ordersPair *pgPair
	// adminToken is the warehouse's admin token in this shop, new for each (crypto/rand).
	adminToken string
	// cluster is the shop's three-node broker when the shop asked for one
	// (ShopSpec.BrokerCluster); nil otherwise: the target's node, through the proxy.
	cluster *rabbitCluster
	// tls are the shop's own servers, which take TLS alone, when the shop asked for them
	// (ShopSpec.TLS); nil otherwise: the target's servers, without TLS.
	tls *tlsServers
	// lab is the shop's network lab when the shop asked for one (ShopSpec.Network); nil
	// otherwise: everything beside the runner, on 127.0.0.1.
	lab *shopLab
}

// baseService is the service a process is a replica of ("orders-relay-2" → orders-relay).
func baseService(s Service) Service {
	for _, svc := range Services {
		if s == svc || strings.HasPrefix(string(s), string(svc)+"-") && isDigits(string(s)[len(svc)+1:]) {
			return svc
		}
	}
	return s
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// relayOf is the relay process whose ops port a process of the service of relay gets: a
// relay replica its own, the API its service's first relay (unused: the API serves its own
// port).
func relayOf(s, relay Service) Service {
	if baseService(s) == relay {
		return s
	}
	return relay
}

var _ Target = (*Local)(nil)

// NewLocal returns the local target. Nothing is started before Prepare.
func NewLocal(cfg LocalConfig) *Local {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.RestartDelay == 0 {
		cfg.RestartDelay = 500 * time.Millisecond
	}
	return &Local{cfg: cfg, log: log}
}

// Name implements Target.
func (l *Local) Name() string { return "local" }

// MissingTools lists the server binaries the local target needs and cannot find: initdb and
// postgres, rabbitmq-server, go.
func MissingTools() []string {
	var missing []string
	if _, err := lookBin("initdb", pgDirs...); err != nil {
		missing = append(missing, "initdb (PostgreSQL server)")
	}
	if _, err := findRabbitScript(); err != nil {
		missing = append(missing, "rabbitmq-server")
	}
	if _, err := exec.LookPath("go"); err != nil {
		missing = append(missing, "go")
	}
	return missing
}

// FindRepo returns the repository root above dir: the first directory with a go.work and
// services/orders.
func FindRepo(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if fileExists(filepath.Join(d, "go.work")) && fileExists(filepath.Join(d, "services", "orders")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no outboxshop repository (go.work with services/orders) above %s", dir)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Prepare implements Target: build, start both PostgreSQL servers and the broker (in
// parallel: the broker takes several seconds), and the proxy.
func (l *Local) Prepare(ctx context.Context, progress func(string)) error {
	if missing := MissingTools(); len(missing) > 0 {
		return fmt.Errorf("local target: missing %s", strings.Join(missing, ", "))
	}
	repo := l.cfg.RepoDir
	if repo == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if repo, err = FindRepo(wd); err != nil {
			return err
		}
	}
	l.runDir = l.cfg.RunDir
	if l.runDir == "" {
		dir, err := os.MkdirTemp("", "outboxshop-chaos-")
		if err != nil {
			return err
		}
		l.runDir, l.made = dir, true
	} else if err := os.MkdirAll(l.runDir, 0o755); err != nil {
		return err
	}
	// The servers run as their own users and must reach their directories.
	if err := os.Chmod(l.runDir, 0o755); err != nil {
		return err
	}
	progress("run directory " + l.runDir)

	suffix := strconv.Itoa(os.Getpid())
	var err error
	if l.ordersPG, err = newPGServer("orders-db", filepath.Join(l.runDir, "pg-orders")); err != nil {
		return err
	}
	if l.warehouse, err = newPGServer("warehouse-db", filepath.Join(l.runDir, "pg-warehouse")); err != nil {
		return err
	}
	if l.rabbit, err = newRabbitServer("chaos"+suffix+"@localhost", filepath.Join(l.runDir, "rabbitmq")); err != nil {
		return err
	}

	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() {
		if errs[0] = l.rabbit.init(); errs[0] == nil {
			errs[0] = l.rabbit.start(ctx)
		}
		if errs[0] == nil {
			// For broker-alarm, which sets it back: read now, while the build runs.
			errs[0] = l.rabbit.readWatermark(ctx)
		}
	})
	wg.Go(func() {
		for _, pg := range []*pgServer{l.ordersPG, l.warehouse} {
			if errs[1] = pg.init(ctx); errs[1] != nil {
				return
			}
			if errs[1] = pg.start(ctx); errs[1] != nil {
				return
			}
		}
	})
	wg.Go(func() { errs[2] = l.build(ctx, repo) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	progress(fmt.Sprintf("built orders and warehouse; PostgreSQL on :%d (orders) and :%d (warehouse); RabbitMQ node %s on :%d",
		l.ordersPG.port, l.warehouse.port, l.rabbit.node, l.rabbit.port))
	if l.brokerProxy, err = proxy.Listen("127.0.0.1:0", l.rabbit.addr()); err != nil {
		return err
	}
	return nil
}

// build compiles both service binaries into the run directory, once for every scenario.
func (l *Local) build(ctx context.Context, repo string) error {
	binDir := filepath.Join(l.runDir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	l.bins = map[string]string{}
	for _, name := range []string{"orders", "warehouse"} {
		out := filepath.Join(binDir, name)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./services/"+name+"/cmd/"+name)
		cmd.Dir = repo
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", name, err, b)
		}
		l.bins[name] = out
	}
	return nil
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// StartShop implements Target: fresh databases (named after the scenario), a broker without
// the shop's exchanges and queues, and the four processes, started in order.
func (l *Local) StartShop(ctx context.Context, spec ShopSpec) (Endpoints, error) {
	l.mu.Lock()
	if l.shop != nil {
		l.mu.Unlock()
		return Endpoints{}, errors.New("local target: a shop is already running")
	}
	l.mu.Unlock()
	if spec.TLS && (spec.OrdersStandby || spec.BrokerCluster || spec.Network) {
		return Endpoints{}, fmt.Errorf("local target: TLS with a standby, a broker cluster or a network lab: %w", ErrUnsupported)
	}
	if spec.Network {
		spec.BrokerCluster, spec.OrdersStandby = true, true
	}
	for svc, n := range spec.Replicas {
		if n > 1 && !slices.Contains(Services, svc) {
			return Endpoints{}, fmt.Errorf("local target: replicas of %q: not a service", svc)
		}
	}
	if !l.rabbit.running() {
		if err := l.rabbit.start(ctx); err != nil {
			return Endpoints{}, err
		}
	}
	for _, pg := range []*pgServer{l.ordersPG, l.warehouse} {
		if !pg.running() {
			if err := pg.start(ctx); err != nil {
				return Endpoints{}, err
			}
		}
	}
	if err := resetBroker(ctx, l.rabbit.URL()); err != nil {
		return Endpoints{}, err
	}
	l.brokerProxy.Heal()
	l.netBase = l.brokerProxy.Stats()

	id := nonWord.ReplaceAllString(strings.ToLower(spec.Name), "_")
	shop := &localShop{
		spec: spec, ordersDB: "orders_" + id, warehouseDB: "warehouse_" + id, adminToken: rand.Text(),
		dir: filepath.Join(l.runDir, "shops", id), procs: map[Service]*process{},
		logStart: map[Component]int64{},
	}
	// What the servers logged before this shop is not its business.
	for c, path := range l.componentLogPaths() {
		if st, err := os.Stat(path); err == nil {
			shop.logStart[c] = st.Size()
		}
	}
	// A database of an earlier run with the same name would not be fresh.
	if err := errors.Join(l.ordersPG.dropDatabase(ctx, shop.ordersDB), l.warehouse.dropDatabase(ctx, shop.warehouseDB)); err != nil {
		return Endpoints{}, err
	}
	if err := os.MkdirAll(shop.dir, 0o755); err != nil {
		return Endpoints{}, err
	}
	// The databases' URLs for the services, and for the runner's own clients: the same,
	// but over TLS.
	ordersURL, warehouseURL := l.ordersPG.URL(shop.ordersDB), l.warehouse.URL(shop.warehouseDB)
	ordersServiceURL, warehouseServiceURL := ordersURL, warehouseURL
	procs := spec.Processes()
	if spec.Network {
		l.mu.Lock()
		l.shop = shop // so that StopShop removes the lab, also when making it fails
		l.mu.Unlock()
		names := []string{HostOrdersPrimary, HostOrdersStandby, HostWarehouseDB}
		for i := 1; i <= clusterSize; i++ {
			names = append(names, brokerHost(i))
		}
		for _, s := range procs {
			names = append(names, string(s))
		}
		lab, err := startShopLab(ctx, id, names)
		shop.lab = lab
		if err != nil {
			return Endpoints{}, err
		}
		// The warehouse's server, in the lab: a copy of the target's, as the orders primary.
		wh, err := newPGServer("warehouse-db", filepath.Join(shop.dir, "pg-warehouse"))
		if err != nil {
			return Endpoints{}, err
		}
		lab.warehouse = wh
		if err := wh.clone(ctx, l.warehouse, false); err != nil {
			return Endpoints{}, err
		}
		if err := lab.place(wh, HostWarehouseDB); err != nil {
			return Endpoints{}, err
		}
		if err := wh.start(ctx); err != nil {
			return Endpoints{}, err
		}
		shop.logStart[WarehouseDB] = 0
		warehouseURL = wh.URL(shop.warehouseDB)
		warehouseServiceURL = warehouseURL
	}
	var ordersServers []string
	if spec.OrdersStandby {
		l.mu.Lock()
		l.shop = shop // so that StopShop removes the pair, also when starting it fails
		l.mu.Unlock()
		pair, err := startPGPair(ctx, filepath.Join(shop.dir, "pg-orders"), l.ordersPG, shop.lab)
		shop.ordersPair = pair
		if err != nil {
			return Endpoints{}, err
		}
		ordersURL = pair.URL(shop.ordersDB)
		ordersServiceURL = ordersURL
		ordersServers = []string{pair.primary.URL(shop.ordersDB), pair.standby.URL(shop.ordersDB)}
	}
	ports := map[Service]int{}
	for _, s := range procs {
		p, err := testinfra.FreePort()
		if err != nil {
			return Endpoints{}, err
		}
		ports[s] = p
	}
	brokerURL := fmt.Sprintf("amqp://guest:guest@%s/", l.brokerProxy.Addr())
	observedURL := l.rabbit.URL()
	var clusterURLs, clusterNodes []string
	if spec.BrokerCluster {
		l.mu.Lock()
		l.shop = shop // so that StopShop removes the cluster, also when starting it fails
		l.mu.Unlock()
		cluster, err := startRabbitCluster(ctx, filepath.Join(shop.dir, "rabbitmq"), "chaos"+strconv.Itoa(os.Getpid())+id, shop.lab)
		shop.cluster = cluster
		if err != nil {
			return Endpoints{}, err
		}
		// The processes reach the nodes directly: the proxy stands before the one node only.
		clusterURLs, clusterNodes = cluster.URLs(), cluster.names()
		brokerURL, observedURL = strings.Join(clusterURLs, ","), clusterURLs[0]
	}
	if spec.TLS {
		l.mu.Lock()
		l.shop = shop // so that StopShop removes the servers, also when starting them fails
		l.mu.Unlock()
		servers, err := startTLSServers(ctx, filepath.Join(shop.dir, "tls"), "chaos"+strconv.Itoa(os.Getpid())+id+"@localhost", l.ordersPG)
		shop.tls = servers
		if err != nil {
			return Endpoints{}, err
		}
		// Their logs are the shop's from their start.
		shop.logStart = map[Component]int64{}
		ordersURL, ordersServiceURL = servers.ordersPG.URL(shop.ordersDB), servers.ordersPG.serviceURL(shop.ordersDB)
		warehouseURL, warehouseServiceURL = servers.warehouse.URL(shop.warehouseDB), servers.warehouse.serviceURL(shop.warehouseDB)
		// The processes reach the node directly: the proxy stands before the target's node.
		brokerURL, observedURL = servers.rabbit.serviceURL(), servers.rabbit.URL()
	}
	addr := func(s Service) string { return "127.0.0.1:" + strconv.Itoa(ports[s]) }
	if shop.lab != nil {
		addr = func(s Service) string { return shop.lab.net.Host(string(s)).IP + ":" + strconv.Itoa(ports[s]) }
	}
	// Each process names itself to PostgreSQL (application_name), so that a scenario can tell
	// its sessions in pg_stat_activity.
	dbURL := func(base string, s Service) string { return base + "&application_name=" + string(s) }
	env := func(s Service) []string {
		env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + shop.dir, "TZ=UTC"}
		switch base := baseService(s); base {
		case OrdersAPI, OrdersRelay:
			env = append(env, ordersSettings(dbURL(ordersServiceURL, s), brokerURL, addr(OrdersAPI), addr(relayOf(s, OrdersRelay)))...)
			if shop.tls != nil {
				env = append(env, shop.tls.settings("ORDERS_")...)
			}
		default:
			env = append(env, warehouseSettings(dbURL(warehouseServiceURL, s), brokerURL, addr(Warehouse), addr(relayOf(s, WarehouseRelay)), shop.adminToken)...)
			if shop.tls != nil {
				env = append(env, shop.tls.settings("WAREHOUSE_")...)
			}
		}
		// The scenario's settings come last: exec keeps the last value of a repeated name.
		return append(append(env, spec.Settings...), spec.ProcessSettings[s]...)
	}
	specs := map[Service]procSpec{
		Warehouse:      {binary: l.bins["warehouse"], args: []string{"api"}, readyBody: `"consumer":"up"`},
		WarehouseRelay: {binary: l.bins["warehouse"], args: []string{"relay"}},
		OrdersAPI:      {binary: l.bins["orders"], args: []string{"api"}},
		OrdersRelay:    {binary: l.bins["orders"], args: []string{"relay"}},
	}
	l.mu.Lock()
	l.shop = shop
	l.mu.Unlock()
	for _, s := range procs {
		ps := specs[baseService(s)]
		ps.service = s
		ps.env = env(s)
		ps.failpoints = spec.Failpoints[s]
		ps.logPath = filepath.Join(shop.dir, string(s)+".log")
		ps.readyURL = "http://" + addr(s) + "/readyz"
		if shop.lab != nil {
			ps.ns = shop.lab.net.Host(string(s)).NS
		}
		p := newProcess(ps, l.cfg.RestartDelay)
		shop.procs[s] = p
		shop.order = append(shop.order, s)
		if err := p.start(); err != nil {
			return Endpoints{}, err
		}
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := p.waitReady(rctx)
		cancel()
		if err != nil {
			return Endpoints{}, err
		}
		if s == OrdersAPI {
			// The stock consumer's queue exists once the orders API consumes it.
			if err := waitQueueConsumed(ctx, observedURL, "orders.stock"); err != nil {
				return Endpoints{}, err
			}
		}
	}
	metrics := map[Service]string{}
	for _, s := range procs {
		metrics[s] = "http://" + addr(s) + "/metrics"
	}
	return Endpoints{
		OrdersURL: "http://" + addr(OrdersAPI), StockURL: "http://" + addr(Warehouse),
		OrdersDB: ordersURL, WarehouseDB: warehouseURL,
		AMQPURL: observedURL, Metrics: metrics, OrdersDBServers: ordersServers, AdminToken: shop.adminToken,
		AMQPURLs: clusterURLs, BrokerNodes: clusterNodes,
	}, nil
}

// ordersSettings is the orders service's environment in a shop: its database, the broker
// (through the proxy), its addresses, and polls and retries faster than the defaults, so that
// a scenario drains quickly.
func ordersSettings(databaseURL, amqpURL, httpAddr, relayAddr string) []string {
	return []string{
		"ORDERS_DATABASE_URL=" + databaseURL,
		"ORDERS_AMQP_URL=" + amqpURL,
		"ORDERS_HTTP_ADDR=" + httpAddr,
		"ORDERS_RELAY_HTTP_ADDR=" + relayAddr,
		"ORDERS_RELAY_POLL_INTERVAL=200ms",
		"ORDERS_CONSUMER_RETRY_DELAY=200ms",
		"ORDERS_HTTP_SHUTDOWN_TIMEOUT=3s",
		"ORDERS_CONSUMER_SHUTDOWN_TIMEOUT=3s",
		"ORDERS_LOG_FORMAT=json",
	}
}

// warehouseSettings is the warehouse's environment in a shop, as ordersSettings, with the
// shop's admin token, which the runner's PUT /stock/{sku} sends (Endpoints.AdminToken).
func warehouseSettings(databaseURL, amqpURL, httpAddr, relayAddr, adminToken string) []string {
	return []string{
		"WAREHOUSE_DATABASE_URL=" + databaseURL,
		"WAREHOUSE_AMQP_URL=" + amqpURL,
		"WAREHOUSE_HTTP_ADDR=" + httpAddr,
		"WAREHOUSE_RELAY_HTTP_ADDR=" + relayAddr,
		"WAREHOUSE_RELAY_POLL_INTERVAL=200ms",
		"WAREHOUSE_CONSUMER_RETRY_DELAY=200ms",
		"WAREHOUSE_SHUTDOWN_TIMEOUT=3s",
		"WAREHOUSE_LOG_FORMAT=json",
		"WAREHOUSE_ADMIN_TOKEN=" + adminToken,
	}
}

func (l *Local) proc(svc Service) (*process, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop == nil || l.shop.procs[svc] == nil {
		return nil, fmt.Errorf("local target: %s is not running", svc)
	}
	return l.shop.procs[svc], nil
}

// WaitDeath implements Target.
func (l *Local) WaitDeath(ctx context.Context, svc Service) (Death, error) {
	p, err := l.proc(svc)
	if err != nil {
		return Death{}, err
	}
	return p.waitDeath(ctx)
}

// Heal implements Target: the supervisor restarts a dead process by itself; Heal waits until
// it is ready.
func (l *Local) Heal(ctx context.Context, svc Service) error {
	p, err := l.proc(svc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return p.waitReady(ctx)
}

// Deaths implements Target.
func (l *Local) Deaths() []Death {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop == nil {
		return nil
	}
	var all []Death
	for _, s := range l.shop.order {
		all = append(all, l.shop.procs[s].Deaths()...)
	}
	return all
}

// Kill implements Target.
func (l *Local) Kill(ctx context.Context, c Component) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ordersPG, warehouse, rabbit := l.servers()
	switch c {
	case Broker:
		return rabbit.kill(ctx)
	case OrdersDB:
		if pair := l.ordersPair(); pair != nil {
			return pair.primary.kill(ctx)
		}
		return ordersPG.kill(ctx)
	case OrdersDBStandby:
		if pair := l.ordersPair(); pair != nil {
			return pair.standby.kill(ctx)
		}
	case WarehouseDB:
		return warehouse.kill(ctx)
	}
	return fmt.Errorf("kill %s: %w", c, ErrUnsupported)
}

// Restart implements Target.
func (l *Local) Restart(ctx context.Context, c Component) error {
	ordersPG, warehouse, rabbit := l.servers()
	switch c {
	case Broker:
		return rabbit.start(ctx)
	case OrdersDB:
		if pair := l.ordersPair(); pair != nil {
			if pair.promoted.Load() {
				// The old primary would come back as a second primary: a split brain.
				return fmt.Errorf("restart %s: %w: its standby was promoted in its place", c, ErrUnsupported)
			}
			return pair.primary.start(ctx)
		}
		return ordersPG.start(ctx)
	case OrdersDBStandby:
		if pair := l.ordersPair(); pair != nil {
			return pair.standby.start(ctx)
		}
	case WarehouseDB:
		return warehouse.start(ctx)
	}
	return fmt.Errorf("restart %s: %w", c, ErrUnsupported)
}

// Pause implements Target: SIGSTOP to the process group.
func (l *Local) Pause(_ context.Context, svc Service) error {
	p, err := l.proc(svc)
	if err != nil {
		return err
	}
	return p.signal(syscall.SIGSTOP)
}

// Resume implements Target: SIGCONT.
func (l *Local) Resume(_ context.Context, svc Service) error {
	p, err := l.proc(svc)
	if err != nil {
		return err
	}
	return p.signal(syscall.SIGCONT)
}

// StopService implements Target.
func (l *Local) StopService(_ context.Context, svc Service, grace time.Duration) (Stopped, error) {
	p, err := l.proc(svc)
	if err != nil {
		return Stopped{}, err
	}
	return p.halt(grace), nil
}

// StartService implements Target: a new incarnation, without crash points, waited for on
// its /readyz.
func (l *Local) StartService(ctx context.Context, svc Service) error {
	p, err := l.proc(svc)
	if err != nil {
		return err
	}
	if err := p.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return p.waitReady(ctx)
}

// Configure implements Target.
func (l *Local) Configure(svc Service, settings ...string) error {
	p, err := l.proc(svc)
	if err != nil {
		return err
	}
	for _, kv := range settings {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("local target: setting %q is not NAME=value", kv)
		}
	}
	p.configure(settings)
	return nil
}

// Exec implements Target: the service's binary, with the environment of its process.
func (l *Local) Exec(ctx context.Context, svc Service, args ...string) ([]byte, error) {
	p, err := l.proc(svc)
	if err != nil {
		return nil, err
	}
	binary, env := p.command()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", svc, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// BrokerAlarm implements Target: rabbitmqctl set_vm_memory_high_watermark on the private
// node, 0 to raise the alarm and the node's value from before to clear it.
func (l *Local) BrokerAlarm(ctx context.Context, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, _, rabbit := l.servers()
	return rabbit.memoryAlarm(ctx, on)
}

// BrokerAlarms implements Target: rabbitmqctl eval rabbit_alarm:get_alarms().
func (l *Local) BrokerAlarms(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, _, rabbit := l.servers()
	return rabbit.alarms(ctx)
}

// componentLogPaths are the current shop's servers' log files.
func (l *Local) componentLogPaths() map[Component]string {
	paths := map[Component]string{}
	ordersPG, warehouse, rabbit := l.servers()
	if ordersPG != nil {
		paths[OrdersDB] = ordersPG.logPath
	}
	if warehouse != nil {
		paths[WarehouseDB] = warehouse.logPath
	}
	if rabbit != nil {
		paths[Broker] = rabbit.logPath()
	}
	return paths
}

// ComponentLogs implements Target: the server's log file from where it was when the shop
// started.
func (l *Local) ComponentLogs(_ context.Context, c Component) (string, error) {
	path, ok := l.componentLogPaths()[c]
	if !ok {
		return "", fmt.Errorf("logs of %s: %w", c, ErrUnsupported)
	}
	l.mu.Lock()
	var from int64
	if l.shop != nil {
		from = l.shop.logStart[c]
	}
	l.mu.Unlock()
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return "", err
	}
	b, err := io.ReadAll(f)
	return string(b), err
}

// CutNetwork implements Target.
func (l *Local) CutNetwork(context.Context) error {
	l.brokerProxy.Cut()
	return nil
}

// DelayNetwork implements Target.
func (l *Local) DelayNetwork(_ context.Context, d time.Duration) error {
	l.brokerProxy.Delay(d)
	return nil
}

// HealNetwork implements Target.
func (l *Local) HealNetwork(context.Context) error {
	l.brokerProxy.Heal()
	return nil
}

// NetworkStats implements Target.
func (l *Local) NetworkStats() NetworkStats {
	s := l.brokerProxy.Stats()
	return NetworkStats{Cut: s.Cut - l.netBase.Cut, Refused: s.Refused - l.netBase.Refused, Delayed: s.Delayed - l.netBase.Delayed}
}

// CPUTime implements Target: utime and stime of /proc/<pid>/stat.
func (l *Local) CPUTime(_ context.Context, svc Service) (ProcessCPU, error) {
	p, err := l.proc(svc)
	if err != nil {
		return ProcessCPU{}, err
	}
	return p.cpuTime()
}

// Logs implements Target.
func (l *Local) Logs(_ context.Context, svc Service) (string, error) {
	p, err := l.proc(svc)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p.spec.logPath)
	return string(b), err
}

// LogPath is the file svc's output goes to in the current shop.
func (l *Local) LogPath(svc Service) string {
	p, err := l.proc(svc)
	if err != nil {
		return ""
	}
	return p.spec.logPath
}

// StopShop implements Target: the processes get SIGTERM (SIGKILL after 5s), the databases
// are dropped. The logs stay in the run directory until Close.
func (l *Local) StopShop(ctx context.Context) error {
	l.mu.Lock()
	shop := l.shop
	l.shop = nil
	l.mu.Unlock()
	if shop == nil {
		return nil
	}
	var wg sync.WaitGroup
	for _, p := range shop.procs {
		wg.Go(func() { p.stop(5 * time.Second) })
	}
	wg.Wait()
	l.brokerProxy.Heal()
	var errs []error
	if shop.cluster != nil {
		errs = append(errs, shop.cluster.remove(ctx))
	}
	if shop.tls != nil {
		errs = append(errs, shop.tls.remove(ctx))
	}
	if shop.ordersPair != nil {
		errs = append(errs, shop.ordersPair.remove(ctx))
	}
	if shop.lab != nil {
		errs = append(errs, shop.lab.close(ctx))
	}
	if shop.ordersPair == nil && l.ordersPG.running() {
		errs = append(errs, l.ordersPG.dropDatabase(ctx, shop.ordersDB))
	}
	if l.warehouse.running() {
		errs = append(errs, l.warehouse.dropDatabase(ctx, shop.warehouseDB))
	}
	return errors.Join(errs...)
}

// Close implements Target: everything stops, and the run directory is removed (unless Keep).
func (l *Local) Close() error {
	var err error
	l.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = l.StopShop(ctx)
		if l.brokerProxy != nil {
			_ = l.brokerProxy.Close()
		}
		if l.rabbit != nil {
			err = errors.Join(err, l.rabbit.kill(ctx))
		}
		for _, pg := range []*pgServer{l.ordersPG, l.warehouse} {
			if pg != nil {
				err = errors.Join(err, pg.stop(ctx))
			}
		}
		if l.made && !l.cfg.Keep && l.runDir != "" {
			err = errors.Join(err, os.RemoveAll(l.runDir))
		}
	})
	return err
}

// RunDir is where the binaries, data and logs are.
func (l *Local) RunDir() string { return l.runDir }

// shopQueues are every queue and exchange a shop declares, and the runner's observer queue:
// deleting them gives the next scenario a broker as new.
var (
	shopQueues    = []string{"warehouse.orders", "warehouse.orders.dead", "orders.stock", "orders.stock.dead", observerQueue}
	shopExchanges = []string{"shop.events", "shop.dlx"}
)

// resetBroker deletes the shop's queues and exchanges.
func resetBroker(ctx context.Context, url string) error {
	conn, err := dialAMQP(ctx, url)
	if err != nil {
		return fmt.Errorf("reset broker: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("reset broker: %w", err)
	}
	for _, q := range shopQueues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("reset broker: delete queue %s: %w", q, err)
		}
	}
	for _, x := range shopExchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return fmt.Errorf("reset broker: delete exchange %s: %w", x, err)
		}
	}
	return nil
}

// waitQueueConsumed waits until queue exists and has a consumer.
func waitQueueConsumed(ctx context.Context, url, queue string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		q, err := inspectQueue(ctx, url, queue)
		return err == nil && q.Consumers > 0, nil
	})
	if err != nil {
		return fmt.Errorf("wait for a consumer on %s: %w", queue, err)
	}
	return nil
}

// inspectQueue returns a queue's depth and consumer count (a passive declare, which fails
// when the queue does not exist).
func inspectQueue(ctx context.Context, url, queue string) (amqp.Queue, error) {
	conn, err := dialAMQP(ctx, url)
	if err != nil {
		return amqp.Queue{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Queue{}, err
	}
	return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// dialAMQP connects with a bounded dial.
func dialAMQP(ctx context.Context, url string) (*amqp.Connection, error) {
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), 100*time.Millisecond)
	}
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(timeout)})
}

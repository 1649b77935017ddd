package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// ComposeConfig configures [NewCompose].
type ComposeConfig struct {
	// File is the compose file. Default docker-compose.yml in the repository root.
	File string
	// Project is the compose project name. Default "outboxshop-chaos".
	Project string
	// Docker is the docker binary. Default "docker".
	Docker string
	// Host is where the stack's published ports are. Default 127.0.0.1.
	Host string
	// Ports are the host ports of orders-api and warehouse (published by the compose file:
	// 8080 and 8090), and of postgres and rabbitmq, which the compose file does not publish:
	// the override file publishes them, on free ports unless set here.
	Ports map[string]int
	// PostgresUser, PostgresPassword, AMQPUser and AMQPPassword are the stack's credentials.
	// Defaults: $POSTGRES_USER, $POSTGRES_PASSWORD, $RABBITMQ_DEFAULT_USER,
	// $RABBITMQ_DEFAULT_PASS, or the compose file's defaults postgres, postgres, guest, guest.
	PostgresUser, PostgresPassword, AMQPUser, AMQPPassword string
	// Exec runs a command and returns its standard output. Default: os/exec. Tests replace
	// it to see the commands the target would run.
	Exec func(ctx context.Context, name string, args ...string) ([]byte, error)
	// Ready waits until url answers 200. Default: polls it for up to 2 minutes.
	Ready func(ctx context.Context, url string) error
	// OverrideDir is where the override file with the crash points is written. Default: a
	// new temporary directory.
	OverrideDir string
	// AdminTokenFile holds the warehouse's admin token, which the compose file mounts as its
	// warehouse-admin-token secret; the runner sends it with PUT /stock/{sku}. Default
	// ComposeAdminTokenFile next to File.
	AdminTokenFile string
}

// ComposeAdminTokenFile is where the compose file's development admin token is, from the
// repository root.
const ComposeAdminTokenFile = "deploy/compose/warehouse-admin-token"

// Compose runs the scenarios against the docker compose stack of the repository (services
// postgres, rabbitmq, orders-api, orders-relay, warehouse, warehouse-relay; not its loadgen,
// whose orders no scenario could account for, nor the monitoring). It kills containers with
// `docker compose kill -s SIGKILL`, starts them again with `docker compose start`, and arms
// crash points through an override file, which also publishes PostgreSQL and RabbitMQ to the
// runner and turns off the restart policy of the four services: a process killed by its
// crash point must stay dead until Heal recreates it without it (Docker would restart it with
// the crash point still armed).
//
// Differences from [Local]: one PostgreSQL serves both services, so orders-db-kill takes the
// warehouse's database down too; and network faults are not supported (there is no proxy
// between the containers).
type Compose struct {
	cfg      ComposeConfig
	override string

	mu        sync.Mutex
	deaths    []Death
	shop      *ShopSpec
	shopStart time.Time
	// configured are the settings Configure gave each service, after the shop's.
	configured map[Service][]string
	watermark  string // the broker's memory high watermark before BrokerAlarm raised it
}

var _ Target = (*Compose)(nil)

// NewCompose returns the compose target.
func NewCompose(cfg ComposeConfig) *Compose {
	if cfg.Project == "" {
		cfg.Project = "outboxshop-chaos"
	}
	if cfg.Docker == "" {
		cfg.Docker = "docker"
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	ports := map[string]int{"orders-api": 8080, "warehouse": 8090}
	for k, v := range cfg.Ports {
		ports[k] = v
	}
	cfg.Ports = ports
	env := func(v, name, def string) string {
		if v != "" {
			return v
		}
		if e := os.Getenv(name); e != "" {
			return e
		}
		return def
	}
	cfg.PostgresUser = env(cfg.PostgresUser, "POSTGRES_USER", "postgres")
	cfg.PostgresPassword = env(cfg.PostgresPassword, "POSTGRES_PASSWORD", "postgres")
	cfg.AMQPUser = env(cfg.AMQPUser, "RABBITMQ_DEFAULT_USER", "guest")
	cfg.AMQPPassword = env(cfg.AMQPPassword, "RABBITMQ_DEFAULT_PASS", "guest")
	if cfg.Exec == nil {
		cfg.Exec = func(ctx context.Context, name string, args ...string) ([]byte, error) {
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
			}
			return out, nil
		}
	}
	if cfg.Ready == nil {
		cfg.Ready = httpReady
	}
	return &Compose{cfg: cfg}
}

// Name implements Target.
func (c *Compose) Name() string { return "compose" }

func (c *Compose) url(service, path string) string {
	return fmt.Sprintf("http://%s:%d%s", c.cfg.Host, c.cfg.Ports[service], path)
}

// compose runs `docker compose` with the project, the compose file and, when there is one,
// the override file.
func (c *Compose) compose(ctx context.Context, args ...string) ([]byte, error) {
	full := []string{"compose", "-p", c.cfg.Project, "-f", c.cfg.File}
	if c.override != "" {
		full = append(full, "-f", c.override)
	}
	return c.cfg.Exec(ctx, c.cfg.Docker, append(full, args...)...)
}

// Prepare implements Target: it checks that an engine answers and builds the images.
func (c *Compose) Prepare(ctx context.Context, progress func(string)) error {
	if c.cfg.File == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		repo, err := FindRepo(wd)
		if err != nil {
			return err
		}
		c.cfg.File = filepath.Join(repo, "docker-compose.yml")
	}
	if _, err := os.Stat(c.cfg.File); err != nil {
		return fmt.Errorf("compose target: %w", err)
	}
	if _, err := c.cfg.Exec(ctx, c.cfg.Docker, "info", "--format", "{{.ServerVersion}}"); err != nil {
		return fmt.Errorf("compose target: no Docker engine answers: %w", err)
	}
	dir := c.cfg.OverrideDir
	if dir == "" {
		d, err := os.MkdirTemp("", "outboxshop-chaos-compose-")
		if err != nil {
			return err
		}
		dir = d
	}
	c.override = filepath.Join(dir, "chaos.override.yml")
	for _, svc := range []string{"postgres", "rabbitmq"} {
		if c.cfg.Ports[svc] == 0 {
			p, err := testinfra.FreePort()
			if err != nil {
				return err
			}
			c.cfg.Ports[svc] = p
		}
	}
	if err := c.writeOverride(nil, nil, nil); err != nil {
		return err
	}
	progress("docker compose build " + strings.Join(serviceNames(), " "))
	_, err := c.compose(ctx, append([]string{"build"}, serviceNames()...)...)
	return err
}

// stack is what the compose target starts: the broker, the database server and the shop.
func stack() []string { return append([]string{"postgres", "rabbitmq"}, serviceNames()...) }

func serviceNames() []string {
	names := make([]string, len(Services))
	for i, s := range Services {
		names[i] = string(s)
	}
	return names
}

// writeOverride writes the override file: PostgreSQL and RabbitMQ published to the runner,
// and for each service no restart policy, CHAOS_FAILPOINTS (empty unless armed) and the
// scenario's settings.
func (c *Compose) writeOverride(failpoints map[Service]string, settings []string, configured map[Service][]string) error {
	var b strings.Builder
	b.WriteString("# Written by the chaos runner: the crash points of the current scenario.\nservices:\n")
	fmt.Fprintf(&b, "  postgres:\n    ports:\n      - \"%s:%d:5432\"\n", c.cfg.Host, c.cfg.Ports["postgres"])
	fmt.Fprintf(&b, "  rabbitmq:\n    ports:\n      - \"%s:%d:5672\"\n", c.cfg.Host, c.cfg.Ports["rabbitmq"])
	for _, s := range Services {
		fmt.Fprintf(&b, "  %s:\n    restart: \"no\"\n    environment:\n      CHAOS_FAILPOINTS: %s\n", s, strconv.Quote(failpoints[s]))
		// A name given twice keeps its last value, as exec does.
		env := map[string]string{}
		var names []string
		for _, kv := range append(slices.Clone(settings), configured[s]...) {
			name, value, ok := strings.Cut(kv, "=")
			if !ok || name == "" {
				return fmt.Errorf("compose target: setting %q is not NAME=value", kv)
			}
			if _, seen := env[name]; !seen {
				names = append(names, name)
			}
			env[name] = value
		}
		for _, name := range names {
			fmt.Fprintf(&b, "      %s: %s\n", name, strconv.Quote(env[name]))
		}
	}
	return os.WriteFile(c.override, []byte(b.String()), 0o644)
}

// published reports whether svc's HTTP port reaches the host (the relays' do not).
func (c *Compose) published(svc Service) bool { return c.cfg.Ports[string(svc)] != 0 }

// StartShop implements Target: `down -v` for fresh volumes (databases, broker), then `up -d
// --wait` of the stack with the crash points in the override file (the services'
// healthchecks are their /readyz).
func (c *Compose) StartShop(ctx context.Context, spec ShopSpec) (Endpoints, error) {
	if _, err := c.compose(ctx, "down", "-v", "--remove-orphans"); err != nil {
		return Endpoints{}, err
	}
	for svc, n := range spec.Replicas {
		if n > 1 {
			return Endpoints{}, fmt.Errorf("%d processes of %s: %w (run the scenario with -target local)", n, svc, ErrUnsupported)
		}
	}
	if len(spec.ProcessSettings) > 0 {
		return Endpoints{}, fmt.Errorf("settings of one process: %w (run the scenario with -target local)", ErrUnsupported)
	}
	if spec.OrdersStandby {
		return Endpoints{}, fmt.Errorf("a standby of the orders database: %w (run the scenario with -target local)", ErrUnsupported)
	}
	if spec.BrokerCluster {
		return Endpoints{}, fmt.Errorf("a RabbitMQ cluster: %w (run the scenario with -target local)", ErrUnsupported)
	}
	if spec.TLS {
		return Endpoints{}, fmt.Errorf("servers that take TLS alone: %w (run the scenario with -target local)", ErrUnsupported)
	}
	if spec.Network {
		return Endpoints{}, fmt.Errorf("a network lab: %w (run the scenario with -target local, as root)", ErrUnsupported)
	}
	c.mu.Lock()
	c.configured = nil
	c.mu.Unlock()
	if err := c.writeOverride(spec.Failpoints, spec.Settings, nil); err != nil {
		return Endpoints{}, err
	}
	if _, err := c.compose(ctx, append([]string{"up", "-d", "--wait"}, stack()...)...); err != nil {
		return Endpoints{}, err
	}
	for _, s := range Services {
		if !c.published(s) {
			continue
		}
		if err := c.cfg.Ready(ctx, c.url(string(s), "/readyz")); err != nil {
			return Endpoints{}, fmt.Errorf("%s: %w", s, err)
		}
	}
	c.mu.Lock()
	c.deaths, c.shop, c.shopStart = nil, &spec, time.Now()
	c.mu.Unlock()
	metrics := map[Service]string{}
	for _, s := range Services {
		if c.published(s) {
			metrics[s] = c.url(string(s), "/metrics")
		}
	}
	tokenFile := cmp.Or(c.cfg.AdminTokenFile, filepath.Join(filepath.Dir(c.cfg.File), ComposeAdminTokenFile))
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return Endpoints{}, fmt.Errorf("compose target: the warehouse's admin token: %w", err)
	}
	pg := (&url.URL{Scheme: "postgres", User: url.UserPassword(c.cfg.PostgresUser, c.cfg.PostgresPassword),
		Host: fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.Ports["postgres"])}).String()
	mq := &url.URL{Scheme: "amqp", User: url.UserPassword(c.cfg.AMQPUser, c.cfg.AMQPPassword),
		Host: fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.Ports["rabbitmq"]), Path: "/"}
	return Endpoints{
		OrdersURL: c.url(string(OrdersAPI), ""), StockURL: c.url(string(Warehouse), ""),
		OrdersDB: pg + "/orders?sslmode=disable", WarehouseDB: pg + "/warehouse?sslmode=disable",
		AMQPURL: mq.String(), Metrics: metrics, AdminToken: strings.TrimRight(string(token), "\r\n"),
	}, nil
}

// containerState is one line of `docker compose ps --format json`.
type containerState struct {
	Service  string
	State    string
	ExitCode int
	Status   string
}

// parsePS reads `docker compose ps --format json`: a JSON array (Compose before 2.21) or
// one JSON object per line.
func parsePS(out []byte) ([]containerState, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return nil, nil
	}
	var list []containerState
	if out[0] == '[' {
		err := json.Unmarshal(out, &list)
		return list, err
	}
	for line := range bytes.Lines(out) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var s containerState
		if err := json.Unmarshal(line, &s); err != nil {
			return nil, fmt.Errorf("docker compose ps: %w", err)
		}
		list = append(list, s)
	}
	return list, nil
}

// WaitDeath implements Target: it polls `docker compose ps -a` until svc's container exited.
// Exit code 137 is 128+SIGKILL: what a crash point does.
func (c *Compose) WaitDeath(ctx context.Context, svc Service) (Death, error) {
	var d Death
	c.mu.Lock()
	var crashPoints []string
	if c.shop != nil {
		crashPoints = crashPointNames(c.shop.Failpoints[svc]) // until Heal recreates svc without them
	}
	c.mu.Unlock()
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		out, err := c.compose(ctx, "ps", "-a", "--format", "json", string(svc))
		if err != nil {
			return false, nil
		}
		states, err := parsePS(out)
		if err != nil {
			return false, err
		}
		for _, s := range states {
			if s.Service == string(svc) && s.State == "exited" {
				d = Death{Service: svc, Incarnation: 1, At: time.Now(), Killed: s.ExitCode == 137,
					Status: fmt.Sprintf("exit code %d (%s)", s.ExitCode, s.Status), CrashPoints: crashPoints}
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return Death{}, err
	}
	c.mu.Lock()
	c.deaths = append(c.deaths, d)
	c.mu.Unlock()
	return d, nil
}

// Heal implements Target: the service is recreated without its crash points.
func (c *Compose) Heal(ctx context.Context, svc Service) error {
	c.mu.Lock()
	fps := map[Service]string{}
	var settings []string
	configured := c.configured
	if c.shop != nil {
		for k, v := range c.shop.Failpoints {
			if k != svc {
				fps[k] = v
			}
		}
		c.shop.Failpoints = fps
		settings = c.shop.Settings
	}
	c.mu.Unlock()
	if err := c.writeOverride(fps, settings, configured); err != nil {
		return err
	}
	if _, err := c.compose(ctx, "up", "-d", "--wait", "--force-recreate", "--no-deps", string(svc)); err != nil {
		return err
	}
	if !c.published(svc) {
		return nil // --wait waited for its healthcheck, its /readyz
	}
	return c.cfg.Ready(ctx, c.url(string(svc), "/readyz"))
}

// Deaths implements Target.
func (c *Compose) Deaths() []Death {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deaths)
}

func composeService(comp Component) (string, error) {
	switch comp {
	case Broker:
		return "rabbitmq", nil
	case OrdersDB:
		return "postgres", nil // one server for both services' databases
	case WarehouseDB:
		return "", fmt.Errorf("%s: %w: one PostgreSQL serves both services (run the scenario with -target local)", comp, ErrUnsupported)
	}
	return "", fmt.Errorf("%s: %w", comp, ErrUnsupported)
}

// Kill implements Target: `docker compose kill -s SIGKILL`.
func (c *Compose) Kill(ctx context.Context, comp Component) error {
	svc, err := composeService(comp)
	if err != nil {
		return err
	}
	_, err = c.compose(ctx, "kill", "-s", "SIGKILL", svc)
	return err
}

// Restart implements Target: `docker compose start`, then wait for its port.
func (c *Compose) Restart(ctx context.Context, comp Component) error {
	svc, err := composeService(comp)
	if err != nil {
		return err
	}
	if _, err := c.compose(ctx, "start", svc); err != nil {
		return err
	}
	addr := fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.Ports[svc])
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return poll(ctx, 250*time.Millisecond, func() (bool, error) { return tcpAnswers(addr), nil })
}

// KillBrokerNode implements Target: the compose stack runs one broker node.
func (c *Compose) KillBrokerNode(_ context.Context, node string) error {
	return fmt.Errorf("kill broker node %s: %w", node, ErrUnsupported)
}

// RestartBrokerNode implements Target: the compose stack runs one broker node.
func (c *Compose) RestartBrokerNode(_ context.Context, node string) error {
	return fmt.Errorf("restart broker node %s: %w", node, ErrUnsupported)
}

// BrokerClusterState implements Target: the compose stack runs one broker node.
func (c *Compose) BrokerClusterState(context.Context) ([]BrokerNodeState, error) {
	return nil, fmt.Errorf("broker cluster state: %w", ErrUnsupported)
}

// Promote implements Target: the compose stack has no standby.
func (c *Compose) Promote(_ context.Context, comp Component) error {
	return fmt.Errorf("promote a standby of %s: %w: the compose stack runs one PostgreSQL (run the scenario with -target local)", comp, ErrUnsupported)
}

// Pause implements Target: `docker compose pause` freezes the service's container.
func (c *Compose) Pause(ctx context.Context, svc Service) error {
	_, err := c.compose(ctx, "pause", string(svc))
	return err
}

// Resume implements Target: `docker compose unpause`.
func (c *Compose) Resume(ctx context.Context, svc Service) error {
	_, err := c.compose(ctx, "unpause", string(svc))
	return err
}

// StopService implements Target: `docker compose stop -t` (SIGTERM, SIGKILL after the
// timeout), then the exit code from `docker compose ps -a`: 137 is SIGKILL.
func (c *Compose) StopService(ctx context.Context, svc Service, grace time.Duration) (Stopped, error) {
	start := time.Now()
	secs := strconv.Itoa(max(1, int(grace.Round(time.Second)/time.Second)))
	if _, err := c.compose(ctx, "stop", "-t", secs, string(svc)); err != nil {
		return Stopped{}, err
	}
	st := Stopped{Service: svc, Took: time.Since(start)}
	out, err := c.compose(ctx, "ps", "-a", "--format", "json", string(svc))
	if err != nil {
		return st, err
	}
	states, err := parsePS(out)
	if err != nil {
		return st, err
	}
	for _, s := range states {
		if s.Service == string(svc) {
			st.Killed = s.ExitCode == 137
			st.Status = fmt.Sprintf("exit status %d", s.ExitCode)
		}
	}
	if st.Status == "" {
		return st, fmt.Errorf("docker compose ps: no container of %s", svc)
	}
	return st, nil
}

// StartService implements Target: the service is recreated without its crash points, as
// Heal does.
func (c *Compose) StartService(ctx context.Context, svc Service) error { return c.Heal(ctx, svc) }

// Configure implements Target: the settings go into the override file when the service is
// next started (StartService recreates its container).
func (c *Compose) Configure(svc Service, settings ...string) error {
	for _, kv := range settings {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("compose target: setting %q is not NAME=value", kv)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := maps.Clone(c.configured)
	if next == nil {
		next = map[Service][]string{}
	}
	next[svc] = append(slices.Clone(next[svc]), settings...)
	c.configured = next
	return nil
}

// Exec implements Target: `docker compose exec -T <service> /app <args>`, in the running
// container, with its environment.
func (c *Compose) Exec(ctx context.Context, svc Service, args ...string) ([]byte, error) {
	return c.compose(ctx, append([]string{"exec", "-T", string(svc), "/app"}, args...)...)
}

// rabbitmqctl runs rabbitmqctl in the broker's container.
func (c *Compose) rabbitmqctl(ctx context.Context, args ...string) (string, error) {
	out, err := c.compose(ctx, append([]string{"exec", "-T", "rabbitmq", "rabbitmqctl", "-q"}, args...)...)
	return strings.TrimSpace(string(out)), err
}

// BrokerAlarm implements Target: rabbitmqctl set_vm_memory_high_watermark in the broker's
// container, 0 to raise the alarm, the value read before to clear it.
func (c *Compose) BrokerAlarm(ctx context.Context, on bool) error {
	c.mu.Lock()
	wm := c.watermark
	c.mu.Unlock()
	if wm == "" {
		var err error
		if wm, err = c.rabbitmqctl(ctx, "eval", evalWatermark); err != nil {
			return err
		}
		c.mu.Lock()
		c.watermark = wm
		c.mu.Unlock()
	}
	args := []string{"0"}
	if !on {
		var err error
		if args, err = watermarkArgs(wm); err != nil {
			return err
		}
	}
	_, err := c.rabbitmqctl(ctx, append([]string{"set_vm_memory_high_watermark"}, args...)...)
	return err
}

// BrokerAlarms implements Target.
func (c *Compose) BrokerAlarms(ctx context.Context) (string, error) {
	return c.rabbitmqctl(ctx, "eval", evalAlarms)
}

// ComponentLogs implements Target: `docker compose logs --since` the shop's start. Both
// databases are one server's.
func (c *Compose) ComponentLogs(ctx context.Context, comp Component) (string, error) {
	svc := map[Component]string{Broker: "rabbitmq", OrdersDB: "postgres", WarehouseDB: "postgres"}[comp]
	if svc == "" {
		return "", fmt.Errorf("logs of %s: %w", comp, ErrUnsupported)
	}
	c.mu.Lock()
	since := c.shopStart
	c.mu.Unlock()
	args := []string{"logs", "--no-color", "--no-log-prefix"}
	if !since.IsZero() {
		args = append(args, "--since", since.UTC().Format(time.RFC3339))
	}
	out, err := c.compose(ctx, append(args, svc)...)
	return string(out), err
}

// CutNetwork implements Target: not supported, there is no proxy between the containers.
func (c *Compose) CutNetwork(context.Context) error {
	return fmt.Errorf("cut the network: %w (run the network scenario with -target local)", ErrUnsupported)
}

// DelayNetwork implements Target: not supported.
func (c *Compose) DelayNetwork(context.Context, time.Duration) error {
	return fmt.Errorf("delay the network: %w (run the network scenario with -target local)", ErrUnsupported)
}

// HealNetwork implements Target: nothing to heal.
func (c *Compose) HealNetwork(context.Context) error { return nil }

// Partition implements Target: the compose target has no network lab.
func (c *Compose) Partition(context.Context, []string, []string, bool) error {
	return fmt.Errorf("partition: %w", ErrUnsupported)
}

// DegradeNetwork implements Target: the compose target has no network lab.
func (c *Compose) DegradeNetwork(context.Context, []string, []string, int, time.Duration, time.Duration) error {
	return fmt.Errorf("degrade the network: %w", ErrUnsupported)
}

// HealPartitions implements Target: the compose target has no network lab.
func (c *Compose) HealPartitions(context.Context) error {
	return fmt.Errorf("heal partitions: %w", ErrUnsupported)
}

// NetworkStats implements Target.
func (c *Compose) NetworkStats() NetworkStats { return NetworkStats{} }

// CPUTime implements Target: not supported (docker stats samples, it does not count).
func (c *Compose) CPUTime(_ context.Context, svc Service) (ProcessCPU, error) {
	return ProcessCPU{}, fmt.Errorf("CPU time of %s: %w", svc, ErrUnsupported)
}

// Logs implements Target: `docker compose logs`.
func (c *Compose) Logs(ctx context.Context, svc Service) (string, error) {
	out, err := c.compose(ctx, "logs", "--no-color", "--no-log-prefix", string(svc))
	return string(out), err
}

// StopShop implements Target: `docker compose down -v` removes the containers and volumes.
func (c *Compose) StopShop(ctx context.Context) error {
	c.mu.Lock()
	c.shop = nil
	c.mu.Unlock()
	_, err := c.compose(ctx, "down", "-v", "--remove-orphans")
	return err
}

// Close implements Target.
func (c *Compose) Close() error {
	if c.override == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.compose(ctx, "down", "-v", "--remove-orphans")
	if c.cfg.OverrideDir == "" {
		err = errors.Join(err, os.RemoveAll(filepath.Dir(c.override)))
	}
	return err
}

// httpReady polls url until it answers 200, for up to 2 minutes.
func httpReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return poll(ctx, 250*time.Millisecond, func() (bool, error) {
		resp, err := readyClient.Get(url)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

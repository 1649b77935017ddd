package compose_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// repoRoot is the repository root: this module is deploy/compose.
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

func repoPath(elem ...string) string { return filepath.Join(append([]string{repoRoot}, elem...)...) }

// goService is what a service built from the Dockerfile runs: the contract between the compose
// file and its neighbours (chaos names the shop's services, prometheus.yml their ports).
type goService struct {
	pkg       string   // the build argument PKG: the binary's package
	command   []string // its command line (the image's entrypoint is the binary)
	listenVar string   // the variable holding the address it serves HTTP on; "" if it serves nothing
	scraped   bool     // Prometheus scrapes its /metrics
}

var goServices = map[string]goService{
	"orders-api":      {pkg: "./services/orders/cmd/orders", command: []string{"api"}, listenVar: "ORDERS_HTTP_ADDR", scraped: true},
	"orders-relay":    {pkg: "./services/orders/cmd/orders", command: []string{"relay"}, listenVar: "ORDERS_RELAY_HTTP_ADDR", scraped: true},
	"warehouse":       {pkg: "./services/warehouse/cmd/warehouse", command: []string{"api"}, listenVar: "WAREHOUSE_HTTP_ADDR", scraped: true},
	"warehouse-relay": {pkg: "./services/warehouse/cmd/warehouse", command: []string{"relay"}, listenVar: "WAREHOUSE_RELAY_HTTP_ADDR", scraped: true},
	"loadgen":         {pkg: "./loadgen/cmd/loadgen"},
	"alert-logger":    {pkg: "./tools/cmd/alertlog", listenVar: "ALERTLOG_HTTP_ADDR"},
}

// oneShots are the services that run to completion: the others that need what they make wait
// for them with service_completed_successfully. They serve nothing, so they have no healthcheck
// and listen on nothing, and they restart on failure alone.
var oneShots = []string{"tls-certs"}

// imageFacts is what the stack relies on in an image made by others, from its documentation.
type imageFacts struct {
	ports    []int    // what it listens on in its container
	env      []string // the variables of it that the stack may set
	required []string // the variables the stack must set
	probes   []string // executables in the image that a healthcheck may run
	doc      string
}

// thirdPartyImages is keyed by image repository, as docker normalises it without
// "docker.io/library/".
var thirdPartyImages = map[string]imageFacts{
	"postgres": {
		ports: []int{5432},
		env:   []string{"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_INITDB_ARGS", "PGDATA"},
		// Without a password the image refuses to start (unless trust, which is not wanted).
		required: []string{"POSTGRES_USER", "POSTGRES_PASSWORD"},
		probes:   []string{"pg_isready"},
		doc:      "https://hub.docker.com/_/postgres (Environment Variables)",
	},
	"rabbitmq": {
		// 5672 (AMQP) unless listeners.tcp = none; the TLS listener's and the plugins' ports
		// come from the mounted configuration and enabled_plugins files.
		ports: []int{5672},
		// RABBITMQ_ERLANG_COOKIE is read by the server and its CLI tools themselves, not by
		// the image's entrypoint: https://github.com/rabbitmq/rabbitmq-server/issues/7262.
		env:      []string{"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS", "RABBITMQ_DEFAULT_VHOST", "RABBITMQ_ERLANG_COOKIE"},
		required: []string{"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS", "RABBITMQ_ERLANG_COOKIE"},
		probes:   []string{"rabbitmq-diagnostics", "rabbitmqctl"},
		doc:      "https://hub.docker.com/_/rabbitmq (Environment Variables), https://www.rabbitmq.com/docs/networking#ports",
	},
	"prom/prometheus": {
		ports:  []int{9090},
		probes: []string{"wget"}, // busybox
		doc:    "https://prometheus.io/docs/prometheus/latest/installation/#using-docker",
	},
	"prom/alertmanager": {
		ports:  []int{9093},
		probes: []string{"wget"}, // busybox
		doc:    "https://github.com/prometheus/alertmanager#docker-images",
	},
	"jaegertracing/all-in-one": {
		// 16686 the UI and query API, 4317 and 4318 OTLP over gRPC and HTTP, 14269 the admin
		// port (health).
		ports:  []int{16686, 4317, 4318, 14269},
		env:    []string{"COLLECTOR_OTLP_ENABLED", "MEMORY_MAX_TRACES", "SPAN_STORAGE_TYPE", "LOG_LEVEL"},
		probes: []string{"wget"}, // alpine
		doc:    "https://www.jaegertracing.io/docs/1.62/getting-started/#all-in-one, https://www.jaegertracing.io/docs/1.62/deployment/#collector",
	},
	"grafana/grafana": {
		ports: []int{3000},
		env: []string{
			"GF_SECURITY_ADMIN_USER", "GF_SECURITY_ADMIN_PASSWORD",
			"GF_AUTH_ANONYMOUS_ENABLED", "GF_AUTH_ANONYMOUS_ORG_ROLE", "GF_AUTH_ANONYMOUS_ORG_NAME",
			"GF_USERS_ALLOW_SIGN_UP", "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
			"GF_ANALYTICS_REPORTING_ENABLED", "GF_ANALYTICS_CHECK_FOR_UPDATES", "GF_LOG_LEVEL",
		},
		required: []string{
			"GF_SECURITY_ADMIN_PASSWORD", "GF_AUTH_ANONYMOUS_ENABLED", "GF_AUTH_ANONYMOUS_ORG_ROLE",
			"GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
		},
		probes: []string{"wget", "curl"}, // alpine
		doc:    "https://grafana.com/docs/grafana/latest/setup-grafana/configure-grafana/#override-configuration-with-environment-variables",
	},
}

// rabbitmqPluginPorts are the ports the RabbitMQ plugins open.
var rabbitmqPluginPorts = map[string]int{"rabbitmq_management": 15672, "rabbitmq_prometheus": 15692}

// publishedPorts are the ports a person opens, on 127.0.0.1: README.md lists them.
var publishedPorts = map[string]int{
	"grafana": 3000, "prometheus": 9090, "alertmanager": 9093, "rabbitmq": 15672,
	"orders-api": 8080, "warehouse": 8090, "jaeger": 16686,
}

// tracedServices are the Go services that export spans, by the service name they give.
var tracedServices = map[string]string{
	"orders-api": "orders-api", "orders-relay": "orders-relay", "warehouse": "warehouse", "warehouse-relay": "warehouse-relay",
}

// loadProject loads docker-compose.yml as docker compose would, with env as the environment
// (and nothing of this process's) and, when envFile, .env.example as the env file.
func loadProject(ctx context.Context, envFile bool, env map[string]string) (*types.Project, error) {
	opts := []cli.ProjectOptionsFn{cli.WithWorkingDirectory(repoRoot)}
	for k, v := range env {
		opts = append(opts, cli.WithEnv([]string{k + "=" + v}))
	}
	if envFile {
		opts = append(opts, cli.WithEnvFiles(repoPath(".env.example")), cli.WithDotEnv)
	}
	o, err := cli.NewProjectOptions([]string{repoPath("docker-compose.yml")}, opts...)
	if err != nil {
		return nil, err
	}
	return o.LoadProject(ctx)
}

var theProject = sync.OnceValues(func() (*types.Project, error) {
	return loadProject(context.Background(), true, nil)
})

// project is the compose project with .env.example, loaded once for all tests.
func project(t *testing.T) *types.Project {
	t.Helper()
	p, err := theProject()
	require.NoError(t, err, "load docker-compose.yml with .env.example")
	return p
}

// envExample reads .env.example.
func envExample(t *testing.T) map[string]string {
	t.Helper()
	env, err := dotenv.GetEnvFromFile(map[string]string{}, []string{repoPath(".env.example")})
	require.NoError(t, err)
	return env
}

func readYAML(t *testing.T, file string, into any) {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, into), file)
}

// environment is a service's environment with every variable set (compose resolves the
// others from the shell, which this stack never relies on).
func environment(t *testing.T, svc types.ServiceConfig) map[string]string {
	t.Helper()
	env := map[string]string{}
	for k, v := range svc.Environment {
		require.NotNil(t, v, "service %s: %s has no value (it would come from the shell)", svc.Name, k)
		env[k] = *v
	}
	return env
}

// imageRepo is the repository of a third-party service's image (postgres, grafana/grafana…).
func imageRepo(image string) string {
	name, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return strings.TrimPrefix(strings.TrimPrefix(name, "docker.io/"), "library/")
}

// hostPath maps a path in svc's container to the file it is on the host through svc's bind
// mounts, or "" when no bind mount covers it.
func hostPath(svc types.ServiceConfig, containerPath string) string {
	best, bestLen := "", -1
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		target := path.Clean(v.Target)
		rel, ok := strings.CutPrefix(path.Clean(containerPath), target)
		if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) || len(target) <= bestLen {
			continue
		}
		best, bestLen = filepath.Join(v.Source, filepath.FromSlash(rel)), len(target)
	}
	return best
}

// listeningPorts returns the ports each service listens on in its container: for the Go
// services the port of their listen variable (as given, or its default in the program), for
// the others the documented ports of the image (RabbitMQ's plugins' from its mounted
// enabled_plugins).
func listeningPorts(t *testing.T, p *types.Project) map[string][]int {
	t.Helper()
	ports := map[string][]int{}
	for name, svc := range p.Services {
		if slices.Contains(oneShots, name) {
			ports[name] = nil
			continue
		}
		if role, ok := goServices[name]; ok {
			if role.listenVar == "" {
				ports[name] = nil
				continue
			}
			addr, given := environment(t, svc)[role.listenVar]
			if !given {
				v, ok := programEnv(t, role.pkg)[role.listenVar]
				require.True(t, ok, "%s: %s reads no %s", name, role.pkg, role.listenVar)
				addr = v.Default
			}
			_, port, err := net.SplitHostPort(addr)
			require.NoError(t, err, "%s: %s=%q", name, role.listenVar, addr)
			n, err := strconv.Atoi(port)
			require.NoError(t, err, "%s: %s=%q", name, role.listenVar, addr)
			ports[name] = []int{n}
			continue
		}
		facts, ok := thirdPartyImages[imageRepo(svc.Image)]
		require.True(t, ok, "service %s: image %s is neither built here nor in thirdPartyImages", name, svc.Image)
		ports[name] = slices.Clone(facts.ports)
		if imageRepo(svc.Image) == "rabbitmq" {
			conf := rabbitmqConf(t, svc)
			if conf["listeners.tcp"] == "none" {
				ports[name] = slices.DeleteFunc(ports[name], func(p int) bool { return p == 5672 })
			}
			if v, ok := conf["listeners.ssl.default"]; ok {
				n, err := strconv.Atoi(v)
				require.NoError(t, err, "%s: listeners.ssl.default = %q", name, v)
				ports[name] = append(ports[name], n)
			}
			for _, plugin := range rabbitmqPlugins(t, svc) {
				if port, ok := rabbitmqPluginPorts[plugin]; ok {
					ports[name] = append(ports[name], port)
				}
			}
		}
	}
	return ports
}

// rabbitmqConf is the configuration mounted into a RabbitMQ service, as the node reads it:
// /etc/rabbitmq/rabbitmq.conf, then the files of /etc/rabbitmq/conf.d in the order of their
// names, a later key replacing an earlier one.
func rabbitmqConf(t *testing.T, svc types.ServiceConfig) map[string]string {
	t.Helper()
	var targets []string
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if v.Target == "/etc/rabbitmq/rabbitmq.conf" || (path.Dir(v.Target) == "/etc/rabbitmq/conf.d" && strings.HasSuffix(v.Target, ".conf")) {
			targets = append(targets, v.Target)
		}
	}
	slices.SortFunc(targets, func(a, b string) int {
		// rabbitmq.conf first, then conf.d by name.
		return strings.Compare(strings.Replace(a, "/rabbitmq.conf", "/", 1), strings.Replace(b, "/rabbitmq.conf", "/", 1))
	})
	conf := map[string]string{}
	for _, target := range targets {
		file := hostPath(svc, target)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		for line := range strings.SplitSeq(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s: %q is not key = value", file, line)
			conf[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return conf
}

var pluginsRE = regexp.MustCompile(`^\s*\[([a-z0-9_,\s]*)\]\s*\.\s*$`)

// rabbitmqPlugins reads the enabled_plugins file mounted into the RabbitMQ service.
func rabbitmqPlugins(t *testing.T, svc types.ServiceConfig) []string {
	t.Helper()
	file := hostPath(svc, "/etc/rabbitmq/enabled_plugins")
	require.NotEmpty(t, file, "service %s: no enabled_plugins file mounted at /etc/rabbitmq/enabled_plugins", svc.Name)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var lines []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line, _, _ = strings.Cut(line, "%"); strings.TrimSpace(line) != "" { // % starts an Erlang comment
			lines = append(lines, line)
		}
	}
	m := pluginsRE.FindStringSubmatch(strings.Join(lines, " "))
	require.NotNil(t, m, "%s is not an Erlang list of plugins such as [rabbitmq_management,rabbitmq_prometheus].", file)
	var plugins []string
	for p := range strings.SplitSeq(m[1], ",") {
		if p = strings.TrimSpace(p); p != "" {
			plugins = append(plugins, p)
		}
	}
	return plugins
}

// target is a host:port that a configuration names.
type target struct {
	where string // what names it
	host  string
	port  int
}

func parseHostPort(where, hostport string) (target, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return target{}, fmt.Errorf("%s: %q: %w", where, hostport, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return target{}, fmt.Errorf("%s: %q: %w", where, hostport, err)
	}
	return target{where: where, host: host, port: n}, nil
}

// parseURLTarget returns the host and port of an http(s) URL, the port defaulting by scheme.
func parseURLTarget(where, raw string) (target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return target{}, fmt.Errorf("%s: %w", where, err)
	}
	if u.Host == "" {
		return target{}, fmt.Errorf("%s: %q has no host", where, raw)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return parseHostPort(where, net.JoinHostPort(u.Hostname(), port))
}

// checkTarget reports whether tg names a service of p and a port it listens on.
func checkTarget(p *types.Project, ports map[string][]int, tg target) error {
	if _, ok := p.Services[tg.host]; !ok {
		return fmt.Errorf("%s: %s is not a compose service (services: %s)", tg.where, tg.host,
			strings.Join(slices.Sorted(maps.Keys(p.Services)), ", "))
	}
	if !slices.Contains(ports[tg.host], tg.port) {
		return fmt.Errorf("%s: service %s listens on %v, not on %d", tg.where, tg.host, ports[tg.host], tg.port)
	}
	return nil
}

// urlList splits a comma-separated list of URLs, such as a service's AMQP URLs (one per
// broker node); a single URL is a list of one.
func urlList(v string) []string {
	if !strings.Contains(v, "://") {
		return []string{v}
	}
	return strings.Split(v, ",")
}

// serviceReferences returns the services that svc's environment and configuration files name
// in URLs: the services it cannot work without.
func serviceReferences(t *testing.T, p *types.Project, svc types.ServiceConfig) []target {
	t.Helper()
	var refs []target
	add := func(where, raw string) {
		for _, one := range urlList(raw) { // a broker variable lists every node
			u, err := url.Parse(one)
			if err != nil || u.Host == "" {
				continue
			}
			if _, ok := p.Services[u.Hostname()]; ok && u.Hostname() != svc.Name {
				port, _ := strconv.Atoi(u.Port())
				refs = append(refs, target{where: where, host: u.Hostname(), port: port})
			}
		}
	}
	for k, v := range environment(t, svc) {
		add(svc.Name+" "+k, v)
	}
	if svc.HealthCheck != nil {
		for _, arg := range svc.HealthCheck.Test {
			add(svc.Name+" healthcheck", arg)
		}
	}
	switch imageRepo(svc.Image) {
	case "grafana/grafana":
		for _, ds := range grafanaDatasources(t, svc) {
			add(svc.Name+" datasource "+ds.Name, ds.URL)
		}
	case "prom/prometheus":
		for _, tg := range prometheusAlertmanagers(t, svc) {
			add(tg.where, "http://"+net.JoinHostPort(tg.host, strconv.Itoa(tg.port)))
		}
	case "prom/alertmanager":
		for _, wh := range alertmanagerWebhooks(t, svc) {
			add(wh.where, wh.url)
		}
	}
	return refs
}

// prometheusConfig is the part of prometheus.yml that the tests read.
type prometheusConfig struct {
	Alerting struct {
		Alertmanagers []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"alertmanagers"`
	} `yaml:"alerting"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// flagValue returns the value of a --name=value or --name value flag in a command line.
func flagValue(command []string, name string) (string, bool) {
	for i, arg := range command {
		if v, ok := strings.CutPrefix(arg, "--"+name+"="); ok {
			return v, true
		}
		if arg == "--"+name && i+1 < len(command) {
			return command[i+1], true
		}
	}
	return "", false
}

// prometheusConfigFile returns where the Prometheus service's configuration is in its
// container and on the host.
func prometheusConfigFile(t *testing.T, svc types.ServiceConfig) (inContainer, onHost string) {
	t.Helper()
	inContainer, ok := flagValue(svc.Command, "config.file")
	if !ok {
		inContainer = "/etc/prometheus/prometheus.yml" // the image's default
	}
	onHost = hostPath(svc, inContainer)
	require.NotEmpty(t, onHost, "service %s: no bind mount holds its config file %s", svc.Name, inContainer)
	require.FileExists(t, onHost)
	return inContainer, onHost
}

func prometheusAlertmanagers(t *testing.T, svc types.ServiceConfig) []target {
	t.Helper()
	_, file := prometheusConfigFile(t, svc)
	var cfg prometheusConfig
	readYAML(t, file, &cfg)
	var out []target
	for _, am := range cfg.Alerting.Alertmanagers {
		for _, sc := range am.StaticConfigs {
			for _, hp := range sc.Targets {
				tg, err := parseHostPort(svc.Name+" alertmanager target", hp)
				require.NoError(t, err)
				out = append(out, tg)
			}
		}
	}
	return out
}

// alertmanagerConfigFile returns the Alertmanager service's configuration on the host.
func alertmanagerConfigFile(t *testing.T, svc types.ServiceConfig) string {
	t.Helper()
	inContainer, ok := flagValue(svc.Command, "config.file")
	if !ok {
		inContainer = "/etc/alertmanager/alertmanager.yml" // the image's default
	}
	onHost := hostPath(svc, inContainer)
	require.NotEmpty(t, onHost, "service %s: no bind mount holds its config file %s", svc.Name, inContainer)
	require.FileExists(t, onHost)
	return onHost
}

type webhook struct{ where, url string }

func alertmanagerWebhooks(t *testing.T, svc types.ServiceConfig) []webhook {
	t.Helper()
	var cfg struct {
		Receivers []struct {
			Name           string `yaml:"name"`
			WebhookConfigs []struct {
				URL string `yaml:"url"`
			} `yaml:"webhook_configs"`
		} `yaml:"receivers"`
	}
	readYAML(t, alertmanagerConfigFile(t, svc), &cfg)
	var out []webhook
	for _, r := range cfg.Receivers {
		for _, wh := range r.WebhookConfigs {
			out = append(out, webhook{where: svc.Name + " receiver " + r.Name, url: wh.URL})
		}
	}
	return out
}

type grafanaDatasource struct {
	Name     string `yaml:"name"`
	UID      string `yaml:"uid"`
	Type     string `yaml:"type"`
	URL      string `yaml:"url"`
	JSONData struct {
		ExemplarTraceIDDestinations []struct {
			Name          string `yaml:"name"`
			DatasourceUID string `yaml:"datasourceUid"`
			URL           string `yaml:"url"`
		} `yaml:"exemplarTraceIdDestinations"`
	} `yaml:"jsonData"`
}

// provisioningFiles returns the YAML files of a Grafana provisioning folder (datasources,
// dashboards) as mounted into svc.
func provisioningFiles(t *testing.T, svc types.ServiceConfig, kind string) []string {
	t.Helper()
	dir := hostPath(svc, "/etc/grafana/provisioning/"+kind)
	require.NotEmpty(t, dir, "service %s: /etc/grafana/provisioning/%s is not mounted", svc.Name, kind)
	require.DirExists(t, dir)
	var files []string
	for _, pattern := range []string{"*.yml", "*.yaml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.NotEmpty(t, files, "service %s: no provisioning file in %s", svc.Name, dir)
	return files
}

func grafanaDatasources(t *testing.T, svc types.ServiceConfig) []grafanaDatasource {
	t.Helper()
	var out []grafanaDatasource
	for _, f := range provisioningFiles(t, svc, "datasources") {
		var cfg struct {
			Datasources []grafanaDatasource `yaml:"datasources"`
		}
		readYAML(t, f, &cfg)
		out = append(out, cfg.Datasources...)
	}
	return out
}

type dashboardProvider struct {
	Name    string `yaml:"name"`
	Type    string `yaml:"type"`
	Options struct {
		Path string `yaml:"path"`
	} `yaml:"options"`
}

func grafanaProviders(t *testing.T, svc types.ServiceConfig) []dashboardProvider {
	t.Helper()
	var out []dashboardProvider
	for _, f := range provisioningFiles(t, svc, "dashboards") {
		var cfg struct {
			Providers []dashboardProvider `yaml:"providers"`
		}
		readYAML(t, f, &cfg)
		out = append(out, cfg.Providers...)
	}
	return out
}

// dependencyCycle returns a cycle of depends_on, or nil.
func dependencyCycle(p *types.Project) []string {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var stack []string
	var visit func(string) []string
	visit = func(name string) []string {
		switch state[name] {
		case visiting:
			i := slices.Index(stack, name)
			return append(slices.Clone(stack[i:]), name)
		case done:
			return nil
		}
		state[name] = visiting
		stack = append(stack, name)
		for _, dep := range slices.Sorted(maps.Keys(p.Services[name].DependsOn)) {
			if c := visit(dep); c != nil {
				return c
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = done
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		if c := visit(name); c != nil {
			return c
		}
	}
	return nil
}

// errorsOf runs check on every item and joins the errors, so that a test shows all at once.
func errorsOf[T any](items []T, check func(T) error) error {
	var errs []error
	for _, it := range items {
		if err := check(it); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// marshal is a project as YAML, to compare two loads.
func marshal(t *testing.T, p *types.Project) []byte {
	t.Helper()
	b, err := p.MarshalYAML()
	require.NoError(t, err)
	return bytes.TrimSpace(b)
}

package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The test's Prometheus scrapes and evaluates every second, and every alert's for: is cut to
// localFor, so that the whole chain from a process to an alert runs in seconds.
const (
	localInterval = "1s"
	localFor      = 2 * time.Second
)

// requireTool returns the path of a command-line tool. Without it the test skips, except
// under CI=true, where its absence is a failure (as in deploy's tests).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	const install = "install it with: apt-get install prometheus (Debian, Ubuntu)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not on the PATH and CI=true: %s", name, install)
	}
	t.Skipf("%s is not on the PATH, skipping (CI=true makes this a failure); %s", name, install)
	return ""
}

// localPrometheusConfig derives, from the Prometheus configuration at configPath, one that
// scrapes this test's processes: targets maps each job name to a local address. It returns
// the files to write into an empty folder: prometheus.yml and a copy of every rule file at
// the same relative path, so that rule_files stays as it is.
//
// Everything else is kept (job names, metrics_path, params, labels), except: the global
// scrape and evaluation intervals become localInterval (per-job intervals are dropped), the
// alerting section is dropped (there is no Alertmanager), and every alert's for: longer than
// localFor becomes localFor. A job that targets does not map, or a mapping of a job the
// configuration does not have, is an error: the test must follow the real configuration.
func localPrometheusConfig(configPath string, targets map[string]string) (map[string][]byte, error) {
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", configPath, err)
	}

	global, _ := cfg["global"].(map[string]any)
	if global == nil {
		global = map[string]any{}
	}
	global["scrape_interval"], global["evaluation_interval"] = localInterval, localInterval
	delete(global, "scrape_timeout")
	cfg["global"] = global
	delete(cfg, "alerting")

	var errs []error
	mapped := map[string]bool{}
	scrapeConfigs, _ := cfg["scrape_configs"].([]any)
	for _, item := range scrapeConfigs {
		sc, _ := item.(map[string]any)
		job, _ := sc["job_name"].(string)
		for _, key := range slices.Sorted(maps.Keys(sc)) {
			if strings.HasSuffix(key, "_sd_configs") {
				errs = append(errs, fmt.Errorf("job %q uses %s; the test only knows how to replace static targets", job, key))
			}
		}
		addr, ok := targets[job]
		if !ok {
			errs = append(errs, fmt.Errorf("job %q of %s has no process in this test: map it to one in TestObservability's targets", job, configPath))
			continue
		}
		mapped[job] = true
		statics, _ := sc["static_configs"].([]any)
		if len(statics) != 1 {
			errs = append(errs, fmt.Errorf("job %q has %d static_configs; the test maps exactly one", job, len(statics)))
			continue
		}
		static, _ := statics[0].(map[string]any)
		if list, _ := static["targets"].([]any); len(list) != 1 {
			errs = append(errs, fmt.Errorf("job %q has %d targets; the test maps exactly one", job, len(list)))
			continue
		}
		static["targets"] = []any{addr}
		delete(sc, "scrape_interval")
		delete(sc, "scrape_timeout")
	}
	for _, job := range slices.Sorted(maps.Keys(targets)) {
		if !mapped[job] {
			errs = append(errs, fmt.Errorf("the test maps job %q, which %s does not scrape", job, configPath))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	files := map[string][]byte{}
	rules, err := ruleFilesOf(configPath)
	if err != nil {
		return nil, err
	}
	for _, rel := range rules {
		raw, err := os.ReadFile(filepath.Join(filepath.Dir(configPath), rel))
		if err != nil {
			return nil, err
		}
		if files[rel], err = shortenFor(raw, localFor); err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
	}
	if files["prometheus.yml"], err = yaml.Marshal(cfg); err != nil {
		return nil, err
	}
	return files, nil
}

// shortenFor returns a rule file with every for: longer than d set to d, and nothing else
// changed (comments and key order survive; the indentation may differ).
func shortenFor(raw []byte, d time.Duration) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 {
		return nil, errors.New("not a single YAML document")
	}
	for _, group := range valueOf(doc.Content[0], "groups").contentOrNil() {
		for _, rule := range valueOf(group, "rules").contentOrNil() {
			v := valueOf(rule, "for")
			if v.Node == nil {
				continue
			}
			old, err := model.ParseDuration(v.Value)
			if err != nil {
				return nil, fmt.Errorf("line %d: for: %w", v.Line, err)
			}
			if time.Duration(old) > d {
				v.Value = model.Duration(d).String()
			}
		}
	}
	return yaml.Marshal(&doc)
}

type yamlNode struct{ *yaml.Node }

// valueOf returns the value of key in a YAML mapping node, nil when absent.
func valueOf(mapping *yaml.Node, key string) yamlNode {
	if mapping == nil || mapping.Kind != yaml.MappingNode {
		return yamlNode{}
	}
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		if mapping.Content[i].Value == key {
			return yamlNode{mapping.Content[i+1]}
		}
	}
	return yamlNode{}
}

func (n yamlNode) contentOrNil() []*yaml.Node {
	if n.Node == nil {
		return nil
	}
	return n.Content
}

// requireOnlyForShortened checks that a shortened rule file means what the original means,
// but for the alerts' for:.
func requireOnlyForShortened(t *testing.T, name string, original, shortened []byte) {
	t.Helper()
	want, err := parseRuleBytes(name, original)
	require.NoError(t, err)
	got, err := parseRuleBytes(name+" (shortened)", shortened)
	require.NoError(t, err)
	require.Len(t, got, len(want), name)
	for i := range want {
		require.Len(t, got[i].Rules, len(want[i].Rules), "%s group %s", name, want[i].Name)
		for j, r := range want[i].Rules {
			wantFor := min(time.Duration(r.For), localFor)
			require.Equal(t, wantFor, time.Duration(got[i].Rules[j].For), "%s group %s rule %s", name, want[i].Name, r.Alert)
			want[i].Rules[j].For, got[i].Rules[j].For = 0, 0
		}
	}
	require.Equal(t, want, got, "%s: the copy differs in more than for:", name)
}

// promServer is a Prometheus server this test started.
type promServer struct {
	url       string
	api       promv1.API
	transport *http.Transport
	log       *lockedBuffer
}

// startPrometheus writes files (localPrometheusConfig) into a temporary folder and runs the
// prometheus binary on them, on a free local port, until the test ends. It returns once the
// server is ready. When the test fails, the server's log is printed.
func startPrometheus(t *testing.T, bin string, files map[string][]byte) *promServer {
	t.Helper()
	dir := t.TempDir() // removed after the cleanup below has killed the server
	for rel, content := range files {
		path := filepath.Join(dir, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, content, 0o644))
	}

	addr := freeLocalAddr(t)
	p := &promServer{url: "http://" + addr, transport: &http.Transport{}, log: &lockedBuffer{}}
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		// As docker-compose.yml runs it: the latency histograms' exemplars are kept.
		"--enable-feature=exemplar-storage",
		// Prometheus 2.x logs a scrape it could not ingest (an exposition its parser
		// rejects, e.g. an OpenMetrics exemplar on a line other than a _bucket or _total
		// before 2.43) only at debug level, as "Append failed": the scrape is rolled back
		// and every series of the target marked stale. The log is shown when the test fails.
		"--log.level=debug",
	)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		p.transport.CloseIdleConnections()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log)
		}
	})

	client, err := promapi.NewClient(promapi.Config{Address: p.url, RoundTripper: p.transport})
	require.NoError(t, err)
	p.api = promv1.NewAPI(client)

	httpClient := &http.Client{Transport: p.transport, Timeout: time.Second}
	waitFor(t, 30*time.Second, "prometheus ready", func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("prometheus exited: %v\n%s", waitErr, p.log)
		default:
		}
		resp, err := httpClient.Get(p.url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// query evaluates expr now and returns its value; an error is the server's answer (bad_data
// for an expression it does not accept).
func (p *promServer) query(t *testing.T, expr string) (model.Value, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	v, warnings, _, err := p.api.Query(ctx, expr, time.Time{})
	if len(warnings) > 0 {
		t.Logf("prometheus warns about %s: %v", expr, warnings)
	}
	return v, err
}

// exemplars returns the exemplars Prometheus stored for the series of selector since start.
func (p *promServer) exemplars(t *testing.T, selector string, start time.Time) []promv1.ExemplarQueryResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r, err := p.api.QueryExemplars(ctx, selector, start.Add(-time.Minute), time.Now().Add(time.Minute))
	require.NoError(t, err, "query_exemplars %s", selector)
	return r
}

// scalar evaluates an expression that returns at most one sample, and returns its value; ok
// is false when it returns none.
func (p *promServer) scalar(t *testing.T, expr string) (value float64, ok bool) {
	t.Helper()
	v, err := p.query(t, expr)
	require.NoError(t, err, expr)
	vec, isVector := v.(model.Vector)
	require.True(t, isVector, "%s returned a %s", expr, v.Type())
	require.LessOrEqual(t, len(vec), 1, "%s returned several samples: %s", expr, vec)
	if len(vec) == 0 {
		return 0, false
	}
	return float64(vec[0].Value), true
}

// describe returns expr's value now, one line per series, for a failure message.
func (p *promServer) describe(t *testing.T, expr string) string {
	t.Helper()
	v, err := p.query(t, expr)
	if err != nil {
		return fmt.Sprintf("%s: %v", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return fmt.Sprintf("%s = %v", expr, v)
	}
	lines := []string{fmt.Sprintf("%s: %d series", expr, len(vec))}
	for _, s := range vec {
		lines = append(lines, fmt.Sprintf("  %s = %v", s.Metric, s.Value))
	}
	return strings.Join(lines, "\n")
}

// count returns the number of series expr selects now.
func (p *promServer) count(t *testing.T, expr string) int {
	t.Helper()
	n, _ := p.scalar(t, "count("+expr+")")
	return int(n)
}

func (p *promServer) alerts(t *testing.T) []promv1.Alert {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := p.api.Alerts(ctx)
	require.NoError(t, err)
	return res.Alerts
}

func (p *promServer) rules(t *testing.T) []promv1.RuleGroup {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := p.api.Rules(ctx, nil)
	require.NoError(t, err)
	return res.Groups
}

func (p *promServer) targets(t *testing.T) []promv1.ActiveTarget {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := p.api.Targets(ctx)
	require.NoError(t, err)
	return res.Active
}

// waitFor calls check every 250 ms until it reports done, and fails the test with the last
// status it reported when timeout passes first.
func waitFor(t *testing.T, timeout time.Duration, what string, check func() (done bool, status string)) {
	t.Helper()
	if status, ok := poll(t, timeout, check); !ok {
		t.Fatalf("%s: not within %s; last seen:\n%s", what, timeout, status)
	}
}

// poll calls check every 250 ms until it reports done or timeout passes, and returns the last
// status it reported; ok is false when timeout passed first (or the test ended).
func poll(t *testing.T, timeout time.Duration, check func() (done bool, status string)) (status string, ok bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		done, status := check()
		if done || time.Now().After(deadline) {
			return status, done
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			return status, false
		}
	}
}

// freeLocalAddr returns a 127.0.0.1 address with a port nobody listens on at the moment.
func freeLocalAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestObservabilityPrometheusConfig(t *testing.T) {
	t.Parallel()

	targets := map[string]string{
		"orders-api": "127.0.0.1:1", "orders-relay": "127.0.0.1:2", "warehouse": "127.0.0.1:3",
		"warehouse-relay": "127.0.0.1:4", "rabbitmq": "127.0.0.1:5", "rabbitmq-detailed": "127.0.0.1:5",
	}

	t.Run("every job scrapes its local process, every rule file is copied with short for:", func(t *testing.T) {
		t.Parallel()
		files, err := localPrometheusConfig(deployPrometheusConfig, targets)
		require.NoError(t, err)

		var cfg struct {
			Global        map[string]any   `yaml:"global"`
			Alerting      any              `yaml:"alerting"`
			RuleFiles     []string         `yaml:"rule_files"`
			ScrapeConfigs []map[string]any `yaml:"scrape_configs"`
		}
		require.NoError(t, yaml.Unmarshal(files["prometheus.yml"], &cfg))
		require.Equal(t, localInterval, cfg.Global["scrape_interval"])
		require.Equal(t, localInterval, cfg.Global["evaluation_interval"])
		require.Nil(t, cfg.Alerting, "no Alertmanager in the test")
		got := map[string]any{}
		for _, sc := range cfg.ScrapeConfigs {
			got[sc["job_name"].(string)] = sc["static_configs"]
		}
		want := map[string]any{}
		for job, addr := range targets {
			want[job] = []any{map[string]any{"targets": []any{addr}}}
		}
		require.Equal(t, want, got)
		i := slices.IndexFunc(cfg.ScrapeConfigs, func(sc map[string]any) bool { return sc["job_name"] == "rabbitmq-detailed" })
		require.GreaterOrEqual(t, i, 0, "job rabbitmq-detailed")
		detailed := cfg.ScrapeConfigs[i]
		require.Equal(t, "/metrics/detailed", detailed["metrics_path"], "kept as it is")
		require.NotEmpty(t, detailed["params"], "kept as it is")

		rules, err := ruleFilesOf(deployPrometheusConfig)
		require.NoError(t, err)
		for _, rel := range rules {
			original, err := os.ReadFile(filepath.Join(filepath.Dir(deployPrometheusConfig), rel))
			require.NoError(t, err)
			requireOnlyForShortened(t, rel, original, files[rel])
		}
		require.Len(t, files, len(rules)+1)
	})

	t.Run("a job without a local process is an error", func(t *testing.T) {
		t.Parallel()
		partial := maps.Clone(targets)
		delete(partial, "warehouse-relay")
		_, err := localPrometheusConfig(deployPrometheusConfig, partial)
		require.ErrorContains(t, err, `job "warehouse-relay"`)
	})

	t.Run("a mapping of a job the configuration lacks is an error", func(t *testing.T) {
		t.Parallel()
		extra := maps.Clone(targets)
		extra["payments"] = "127.0.0.1:6"
		_, err := localPrometheusConfig(deployPrometheusConfig, extra)
		require.ErrorContains(t, err, `job "payments"`)
	})

	t.Run("shortenFor changes only for:", func(t *testing.T) {
		t.Parallel()
		in := []byte("groups:\n  - name: g\n    rules:\n      # keep me\n      - alert: A\n        expr: up == 0\n        for: 5m\n        labels:\n          for: 10m\n      - alert: B\n        expr: up == 0\n        for: 1s\n      - record: r:up:sum\n        expr: sum(up)\n")
		out, err := shortenFor(in, localFor)
		require.NoError(t, err)
		require.Contains(t, string(out), "# keep me")
		requireOnlyForShortened(t, "inline", in, out)
		groups, err := parseRuleBytes("inline", out)
		require.NoError(t, err)
		require.Equal(t, "10m", groups[0].Rules[0].Labels["for"], "a label named for is not a for:")
	})
}

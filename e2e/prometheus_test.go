package e2e_test

import (
	"bytes"
	"context"
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
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxshop/outboxshop/deploy/observe"
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

// localPrometheusConfig generates, with deploy/observe (as make observe does for the shop on
// this machine), the compose Prometheus configuration for this test's processes: local maps
// every compose address of observe.Addresses to the address of the process that stands for
// it here, one process per role. The scrape and evaluation intervals are localInterval, and
// every alert's for: longer than localFor becomes localFor. It returns the path of the
// generated prometheus.yml, with the rule files next to it.
//
// A compose address that local does not map, or a mapping of one the table does not have, is
// an error: the test must follow the real configuration. observe.Generate fails on a compose
// job whose address the table lacks.
func localPrometheusConfig(t *testing.T, local map[string]string) string {
	t.Helper()
	var addrs []observe.Address
	var missing []string
	unknown := maps.Clone(local)
	for _, a := range observe.Addresses {
		addr, ok := local[a.Compose]
		if !ok {
			missing = append(missing, a.Compose)
			continue
		}
		delete(unknown, a.Compose)
		a.Roles = addr
		addrs = append(addrs, a)
	}
	require.Empty(t, missing, "compose addresses of deploy/observe's Addresses with no process in this test: map them to one")
	require.Empty(t, unknown, "the test maps compose addresses that deploy/observe's Addresses does not have")

	dir := t.TempDir()
	require.NoError(t, observe.Generate(observe.Options{
		Deploy:    deployDir,
		Dir:       dir,
		Layout:    observe.LayoutRoles,
		Addresses: addrs,
		Interval:  localInterval,
		MaxFor:    localFor,
	}))
	return filepath.Join(dir, observe.PrometheusConfig)
}

// scrapeTargets returns the target of each job of a Prometheus configuration that scrapes
// one static target per job, as the generated configuration does.
func scrapeTargets(t *testing.T, configPath string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(configPath)
	require.NoError(t, err)
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg), configPath)
	targets := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		require.Len(t, sc.StaticConfigs, 1, "%s: job %s", configPath, sc.JobName)
		require.Len(t, sc.StaticConfigs[0].Targets, 1, "%s: job %s", configPath, sc.JobName)
		targets[sc.JobName] = sc.StaticConfigs[0].Targets[0]
	}
	return targets
}

// requireOnlyForCut checks that the rule file at path, a copy that localPrometheusConfig
// made of original, means what original means but for its alerts' for:, cut to localFor.
func requireOnlyForCut(t *testing.T, path string, original []rulefmt.RuleGroup) {
	t.Helper()
	got, err := parseRules(path)
	require.NoError(t, err)
	want := slices.Clone(original)
	for i := range want {
		want[i].Rules = slices.Clone(want[i].Rules)
		for j := range want[i].Rules {
			want[i].Rules[j].For = model.Duration(min(time.Duration(want[i].Rules[j].For), localFor))
		}
	}
	require.Equal(t, want, got, "%s: the copy differs from the original in more than the alerts' for:", path)
}

// promServer is a Prometheus server this test started.
type promServer struct {
	url       string
	api       promv1.API
	transport *http.Transport
	log       *lockedBuffer
}

// startPrometheus runs the prometheus binary on the configuration at configFile
// (localPrometheusConfig), listening on addr, until the test ends. It returns once the server
// is ready. When the test fails, the server's log is printed.
func startPrometheus(t *testing.T, bin, configFile, addr string) *promServer {
	t.Helper()
	data := t.TempDir() // removed after the cleanup below has killed the server

	p := &promServer{url: "http://" + addr, transport: &http.Transport{}, log: &lockedBuffer{}}
	cmd := exec.Command(bin,
		"--config.file="+configFile,
		"--storage.tsdb.path="+data,
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

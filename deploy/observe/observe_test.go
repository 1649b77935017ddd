package observe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	promparser "github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// Paths, relative to this package's folder (go test runs there).
const (
	deployDir = ".."
	repoDir   = "../.."
)

// lookTool returns the path of a command-line tool. Without it the test skips, except under
// CI=true, where .ci/run installs it and its absence is a failure (the deploy tests' rule).
func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	requireInstalled(t, fmt.Errorf("%s is not on the PATH; %s", name, Install))
	return ""
}

func requireInstalled(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%v (CI=true)", err)
	}
	t.Skipf("%v; skipping (CI=true makes this a failure)", err)
}

// serviceDefaults reads the envDefault of the HTTPAddr and RelayHTTPAddr fields of a
// service's Config (services/<name>/app/config.go): the ports `make run` uses.
func serviceDefaults(t *testing.T, service string) (api, relay string) {
	t.Helper()
	path := filepath.Join(repoDir, "services", service, "app", "config.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	require.NoError(t, err)
	defaults := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		require.True(t, ok, "%s: Config is not a struct", path)
		for _, field := range st.Fields.List {
			if field.Tag == nil || len(field.Names) != 1 {
				continue
			}
			tag, err := strconv.Unquote(field.Tag.Value)
			require.NoError(t, err)
			defaults[field.Names[0].Name] = reflect.StructTag(tag).Get("envDefault")
		}
		return false
	})
	api, relay = defaults["HTTPAddr"], defaults["RelayHTTPAddr"]
	require.NotEmpty(t, api, "%s: Config.HTTPAddr has no envDefault", path)
	require.NotEmpty(t, relay, "%s: Config.RelayHTTPAddr has no envDefault", path)
	return "127.0.0.1" + api, "127.0.0.1" + relay
}

// TestAddresses checks the table against where the services listen: their default ports,
// which the run target of the Makefile leaves alone, running each service as `all`.
func TestAddresses(t *testing.T) {
	t.Parallel()

	ordersAPI, ordersRelay := serviceDefaults(t, "orders")
	warehouseAPI, warehouseRelay := serviceDefaults(t, "warehouse")
	want := map[string]Address{
		"orders-api:8080":      {All: ordersAPI, Roles: ordersAPI},
		"orders-relay:8081":    {All: ordersAPI, Roles: ordersRelay, Relay: true},
		"warehouse:8090":       {All: warehouseAPI, Roles: warehouseAPI},
		"warehouse-relay:8091": {All: warehouseAPI, Roles: warehouseRelay, Relay: true},
	}
	servers := map[string]bool{composePrometheus: true, composeAlertmanager: true, composeAlertLogger: true}
	for _, a := range Addresses {
		if w, ok := want[a.Compose]; ok {
			w.Compose = a.Compose
			require.Equal(t, w, a)
		}
	}
	// The servers of make observe listen where nothing else of the layout does.
	for _, l := range []Layout{LayoutAll, LayoutRoles} {
		used := map[string]string{} // local address -> compose address
		for _, a := range Addresses {
			local := a.Local(l)
			host, _, err := net.SplitHostPort(local)
			require.NoError(t, err, a.Compose)
			require.Equal(t, "127.0.0.1", host, a.Compose)
			if other, ok := used[local]; ok && (servers[a.Compose] || servers[other]) {
				t.Fatalf("layout %s: %s and %s are both on %s", l, a.Compose, other, local)
			}
			used[local] = a.Compose
		}
	}
	for compose := range servers {
		_, err := newTable(LayoutAll, Addresses).row(compose)
		require.NoError(t, err)
	}

	raw, err := os.ReadFile(filepath.Join(repoDir, "Makefile"))
	require.NoError(t, err)
	recipe := makeRecipe(t, string(raw), "run")
	require.Contains(t, recipe, "bin/orders all", "make run no longer runs orders as one process: the layout of make observe must follow")
	require.Contains(t, recipe, "bin/warehouse all", "make run no longer runs the warehouse as one process: the layout of make observe must follow")
	require.NotContains(t, recipe, "HTTP_ADDR", "make run sets a listen address: the table must follow")
}

// makeRecipe returns the recipe lines of a Makefile target.
func makeRecipe(t *testing.T, makefile, target string) string {
	t.Helper()
	var recipe []string
	in := false
	for line := range strings.Lines(makefile) {
		switch {
		case strings.HasPrefix(line, target+":"):
			in = true
		case in && strings.HasPrefix(line, "\t"):
			recipe = append(recipe, line)
		case in:
			in = false
		}
	}
	require.NotEmpty(t, recipe, "no recipe for %s in the Makefile", target)
	return strings.Join(recipe, "")
}

// scrapeConfig is what the tests read of a generated scrape configuration.
type scrapeConfig struct {
	JobName        string              `yaml:"job_name"`
	ScrapeInterval string              `yaml:"scrape_interval"`
	ScrapeTimeout  string              `yaml:"scrape_timeout"`
	MetricsPath    string              `yaml:"metrics_path"`
	Params         map[string][]string `yaml:"params"`
	StaticConfigs  []struct {
		Targets []string `yaml:"targets"`
	} `yaml:"static_configs"`
	MetricRelabelConfigs []relabelConfig `yaml:"metric_relabel_configs"`
}

// prometheusConfig is what the tests read of a generated Prometheus configuration.
type prometheusConfig struct {
	Global        map[string]string `yaml:"global"`
	ScrapeConfigs []scrapeConfig    `yaml:"scrape_configs"`
}

// jobTargets maps each job of a generated configuration to its one target.
func jobTargets(t *testing.T, cfg prometheusConfig) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		require.Len(t, sc.StaticConfigs, 1, sc.JobName)
		require.Len(t, sc.StaticConfigs[0].Targets, 1, sc.JobName)
		got[sc.JobName] = sc.StaticConfigs[0].Targets[0]
	}
	return got
}

func TestGenerate(t *testing.T) {
	t.Parallel()

	for _, layout := range []Layout{LayoutAll, LayoutRoles} {
		t.Run(string(layout), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// A rule file left by an earlier run, since deleted from the repository.
			stale := filepath.Join(dir, "prometheus", "rules", "deleted.yml")
			require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o755))
			require.NoError(t, os.WriteFile(stale, []byte("groups: []\n"), 0o644))

			require.NoError(t, Generate(Options{Deploy: deployDir, Dir: dir, Layout: layout}))
			tbl := newTable(layout, Addresses)

			t.Run("same configuration, local addresses", func(t *testing.T) {
				// The source with every compose address replaced is the generated file
				// without the metric relabelling.
				want := readAny(t, filepath.Join(deployDir, sourcePrometheus))
				rewriteStrings(want, tbl)
				got := readAny(t, filepath.Join(dir, PrometheusConfig))
				for _, job := range got.(map[string]any)["scrape_configs"].([]any) {
					delete(job.(map[string]any), "metric_relabel_configs")
				}
				require.Equal(t, want, got)

				want = readAny(t, filepath.Join(deployDir, sourceAlertmanager))
				rewriteStrings(want, tbl)
				require.Equal(t, want, readAny(t, filepath.Join(dir, AlertmanagerConfig)))
			})

			t.Run("targets", func(t *testing.T) {
				var cfg prometheusConfig
				readInto(t, filepath.Join(dir, PrometheusConfig), &cfg)
				// The services' default ports, which make run uses.
				ordersAPI, ordersRelay := serviceDefaults(t, "orders")
				warehouseAPI, warehouseRelay := serviceDefaults(t, "warehouse")
				if layout == LayoutAll {
					// A relay's metrics are on its service's API port.
					ordersRelay, warehouseRelay = ordersAPI, warehouseAPI
				}
				want := map[string]string{
					"orders-api":        ordersAPI,
					"orders-relay":      ordersRelay,
					"warehouse":         warehouseAPI,
					"warehouse-relay":   warehouseRelay,
					"rabbitmq":          "127.0.0.1:15692",
					"rabbitmq-detailed": "127.0.0.1:15692",
				}
				require.Equal(t, want, jobTargets(t, cfg))
				requireDetailedRabbitMQ(t, cfg)
			})

			t.Run("each series under the job of its role", func(t *testing.T) {
				var cfg struct {
					ScrapeConfigs []scrapeConfig `yaml:"scrape_configs"`
				}
				readInto(t, filepath.Join(dir, PrometheusConfig), &cfg)
				actions := map[string]string{}
				var regex string
				for _, sc := range cfg.ScrapeConfigs {
					if len(sc.MetricRelabelConfigs) == 0 {
						continue
					}
					require.Len(t, sc.MetricRelabelConfigs, 1, sc.JobName)
					rc := sc.MetricRelabelConfigs[0]
					require.Equal(t, []string{"__name__"}, rc.SourceLabels)
					actions[sc.JobName], regex = rc.Action, rc.Regex
				}
				if layout == LayoutRoles {
					require.Empty(t, actions, "one process per role: nothing to split")
					return
				}
				require.Equal(t, map[string]string{
					"orders-api": "drop", "orders-relay": "keep", "warehouse": "drop", "warehouse-relay": "keep",
				}, actions)

				// Prometheus anchors the regex.
				re := regexp.MustCompile("^(?:" + regex + ")$")
				for _, name := range relayExposition(t) {
					require.True(t, re.MatchString(name), "%s is a relay's metric: the relay job must keep it", name)
				}
				for _, name := range []string{
					"outbox_pending_messages", "outbox_oldest_pending_age_seconds", "outbox_dead_messages",
					"outbox_stats_last_success_timestamp_seconds", "inbox_messages_processed_total",
					"http_requests_total", "http_request_duration_seconds_bucket", "orders_created_total",
					"pgxpool_total_conns", "go_goroutines", "process_resident_memory_bytes",
				} {
					require.False(t, re.MatchString(name), "%s is not a relay's metric: the API job must keep it", name)
				}
			})

			t.Run("rules copied unchanged", func(t *testing.T) {
				src, err := filepath.Glob(filepath.Join(deployDir, "prometheus", "rules", "*.yml"))
				require.NoError(t, err)
				require.NotEmpty(t, src)
				dst, err := filepath.Glob(filepath.Join(dir, "prometheus", "rules", "*.yml"))
				require.NoError(t, err)
				require.Len(t, dst, len(src), "the stale rule file is removed")
				for _, f := range src {
					want, err := os.ReadFile(f)
					require.NoError(t, err)
					got, err := os.ReadFile(filepath.Join(dir, "prometheus", "rules", filepath.Base(f)))
					require.NoError(t, err)
					require.Equal(t, string(want), string(got), f)
				}
			})

			t.Run("promtool check config", func(t *testing.T) {
				t.Parallel()
				promtool := lookTool(t, "promtool")
				// Also loads every rule file the configuration names.
				runTool(t, promtool, "check", "config", filepath.Join(dir, PrometheusConfig))
			})
			t.Run("amtool check-config", func(t *testing.T) {
				t.Parallel()
				amtool := lookTool(t, "amtool")
				runTool(t, amtool, "check-config", filepath.Join(dir, AlertmanagerConfig))
			})
		})
	}

	t.Run("an address missing from the table", func(t *testing.T) {
		t.Parallel()
		deploy := editedDeploy(t, func(s string) string {
			return strings.Replace(s, "warehouse-relay:8091", "warehouse-relay-2:8091", 1)
		})
		err := Generate(Options{Deploy: deploy, Dir: t.TempDir()})
		require.ErrorContains(t, err, "warehouse-relay-2:8091 is not in the table")
	})

	t.Run("a row missing from a table of the caller", func(t *testing.T) {
		t.Parallel()
		addrs := slices.DeleteFunc(slices.Clone(Addresses), func(a Address) bool { return a.Compose == "warehouse-relay:8091" })
		err := Generate(Options{Deploy: deployDir, Dir: t.TempDir(), Layout: LayoutRoles, Addresses: addrs})
		require.ErrorContains(t, err, "job warehouse-relay: warehouse-relay:8091 is not in the table")
	})

	t.Run("a job whose targets cannot be rewritten", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct{ edit, want string }{
			"discovered": {
				edit: "  - job_name: payments\n    dns_sd_configs:\n      - names: [payments]\n        type: A\n        port: 8070\n",
				want: "job payments: uses dns_sd_configs",
			},
			"no static target": {
				edit: "  - job_name: payments\n    static_configs:\n      - targets: []\n",
				want: "job payments: has no static_configs target",
			},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				deploy := editedDeploy(t, func(s string) string { return s + tc.edit })
				err := Generate(Options{Deploy: deploy, Dir: t.TempDir()})
				require.ErrorContains(t, err, tc.want)
			})
		}
	})

	t.Run("Interval replaces every interval and drops every timeout", func(t *testing.T) {
		t.Parallel()
		deploy := editedDeploy(t, func(s string) string {
			s = strings.Replace(s, "  evaluation_interval: 15s\n", "  evaluation_interval: 15s\n  scrape_timeout: 10s\n", 1)
			return strings.Replace(s, "  - job_name: orders-api\n", "  - job_name: orders-api\n    scrape_interval: 30s\n    scrape_timeout: 20s\n", 1)
		})
		dir := t.TempDir()
		require.NoError(t, Generate(Options{Deploy: deploy, Dir: dir, Interval: "1s"}))
		var cfg prometheusConfig
		readInto(t, filepath.Join(dir, PrometheusConfig), &cfg)
		require.Equal(t, map[string]string{"scrape_interval": "1s", "evaluation_interval": "1s"}, cfg.Global)
		for _, sc := range cfg.ScrapeConfigs {
			if sc.JobName == "orders-api" {
				require.Equal(t, "1s", sc.ScrapeInterval)
			}
			require.Empty(t, sc.ScrapeTimeout, sc.JobName)
		}
		// A scrape_timeout longer than the interval is an error to Prometheus.
		runTool(t, lookTool(t, "promtool"), "check", "config", "--syntax-only", filepath.Join(dir, PrometheusConfig))
	})

	t.Run("a negative MaxFor", func(t *testing.T) {
		t.Parallel()
		err := Generate(Options{Deploy: deployDir, Dir: t.TempDir(), MaxFor: -time.Second})
		require.ErrorContains(t, err, "MaxFor -1s")
	})
}

// requireDetailedRabbitMQ checks that the job rabbitmq-detailed kept its path and parameters:
// only its target is rewritten.
func requireDetailedRabbitMQ(t *testing.T, cfg prometheusConfig) {
	t.Helper()
	i := slices.IndexFunc(cfg.ScrapeConfigs, func(sc scrapeConfig) bool { return sc.JobName == "rabbitmq-detailed" })
	require.GreaterOrEqual(t, i, 0, "job rabbitmq-detailed")
	require.Equal(t, "/metrics/detailed", cfg.ScrapeConfigs[i].MetricsPath)
	require.Equal(t, []string{"queue_coarse_metrics", "queue_consumer_count"}, cfg.ScrapeConfigs[i].Params["family"])
}

// editedDeploy returns a copy of the compose configuration that Generate reads, its
// prometheus.yml passed through edit.
func editedDeploy(t *testing.T, edit func(string) string) string {
	t.Helper()
	deploy := t.TempDir()
	copyFile(t, filepath.Join(deployDir, sourceAlertmanager), filepath.Join(deploy, sourceAlertmanager))
	rules, err := filepath.Glob(filepath.Join(deployDir, "prometheus", "rules", "*.yml"))
	require.NoError(t, err)
	for _, f := range rules {
		copyFile(t, f, filepath.Join(deploy, "prometheus", "rules", filepath.Base(f)))
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, sourcePrometheus))
	require.NoError(t, err)
	edited := edit(string(raw))
	require.NotEqual(t, string(raw), edited, "the edit changed nothing: the source changed?")
	require.NoError(t, os.WriteFile(filepath.Join(deploy, sourcePrometheus), []byte(edited), 0o644))
	return deploy
}

// TestGenerateForTestProcesses generates the configuration as e2e's TestObservability does: the
// shop's processes on ports of their own, one per role, a short interval, and the alerts'
// for: cut to seconds.
func TestGenerateForTestProcesses(t *testing.T) {
	t.Parallel()
	const maxFor = 2 * time.Second
	local := map[string]string{
		"orders-api:8080": "127.0.0.1:1", "orders-relay:8081": "127.0.0.1:2", "warehouse:8090": "127.0.0.1:3",
		"warehouse-relay:8091": "127.0.0.1:4", "rabbitmq:15692": "127.0.0.1:5",
		composePrometheus: "127.0.0.1:6", composeAlertmanager: "127.0.0.1:7", composeAlertLogger: "127.0.0.1:8",
	}
	var addrs []Address
	for _, a := range Addresses {
		addr, ok := local[a.Compose]
		require.True(t, ok, "%s has no local address in this test", a.Compose)
		a.Roles = addr
		addrs = append(addrs, a)
	}
	dir := t.TempDir()
	require.NoError(t, Generate(Options{Deploy: deployDir, Dir: dir, Layout: LayoutRoles, Addresses: addrs, Interval: "1s", MaxFor: maxFor}))

	t.Run("every job scrapes its process", func(t *testing.T) {
		t.Parallel()
		var cfg prometheusConfig
		readInto(t, filepath.Join(dir, PrometheusConfig), &cfg)
		require.Equal(t, map[string]string{
			"orders-api": "127.0.0.1:1", "orders-relay": "127.0.0.1:2", "warehouse": "127.0.0.1:3",
			"warehouse-relay": "127.0.0.1:4", "rabbitmq": "127.0.0.1:5", "rabbitmq-detailed": "127.0.0.1:5",
		}, jobTargets(t, cfg))
		requireDetailedRabbitMQ(t, cfg)
		require.Equal(t, map[string]string{"scrape_interval": "1s", "evaluation_interval": "1s"}, cfg.Global)
		for _, sc := range cfg.ScrapeConfigs {
			require.Empty(t, sc.MetricRelabelConfigs, "one process per role: nothing to split")
		}
	})

	t.Run("the rule files with only for: cut", func(t *testing.T) {
		t.Parallel()
		src, err := filepath.Glob(filepath.Join(deployDir, "prometheus", "rules", "*.yml"))
		require.NoError(t, err)
		require.NotEmpty(t, src)
		cut := 0
		for _, f := range src {
			original, err := os.ReadFile(f)
			require.NoError(t, err)
			copied, err := os.ReadFile(filepath.Join(dir, "prometheus", "rules", filepath.Base(f)))
			require.NoError(t, err)
			cut += requireOnlyForCut(t, filepath.Base(f), original, copied, maxFor)
		}
		require.Positive(t, cut, "no alert of the rule files waits longer than %s: test a shorter MaxFor", maxFor)
		raw, err := os.ReadFile(filepath.Join(dir, PrometheusConfig))
		require.NoError(t, err)
		require.Contains(t, string(raw), "every alert's for: longer than 2s is cut to 2s", "the header says so")
	})

	t.Run("promtool check config", func(t *testing.T) {
		t.Parallel()
		runTool(t, lookTool(t, "promtool"), "check", "config", filepath.Join(dir, PrometheusConfig))
	})
}

func TestCapFor(t *testing.T) {
	t.Parallel()
	const maxFor = 2 * time.Second
	in := []byte("groups:\n  - name: g\n    rules:\n      # keep me\n      - alert: A\n        expr: up == 0\n        for: 5m\n        labels:\n          for: 10m\n" +
		"      - alert: B\n        expr: up == 0\n        for: 1s\n      - record: r:up:sum\n        expr: sum(up)\n")
	out, err := capFor(in, maxFor)
	require.NoError(t, err)
	require.Equal(t, 1, requireOnlyForCut(t, "inline", in, out, maxFor))
	require.Contains(t, string(out), "# keep me")
	groups := parseRuleBytes(t, "inline", out)
	require.Equal(t, "10m", groups[0].Rules[0].Labels["for"], "a label named for is not a for:")

	t.Run("nothing to cut: the file as it is", func(t *testing.T) {
		in := []byte("groups:\n\n  - name: g\n    rules:\n      - alert: B\n        expr: up == 0\n        for: 1s\n")
		out, err := capFor(in, maxFor)
		require.NoError(t, err)
		require.Equal(t, string(in), string(out))
	})
	t.Run("a for: that is no duration", func(t *testing.T) {
		_, err := capFor([]byte("groups:\n  - name: g\n    rules:\n      - alert: B\n        expr: up == 0\n        for: soon\n"), maxFor)
		require.ErrorContains(t, err, "line 6: for:")
	})
}

// promql parses expressions as Prometheus does by default.
var promql = promparser.NewParser(promparser.Options{})

// parseRuleBytes parses and validates a rule file as Prometheus does.
func parseRuleBytes(t *testing.T, name string, raw []byte) []rulefmt.RuleGroup {
	t.Helper()
	rgs, errs := rulefmt.Parse(raw, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	require.NoError(t, errors.Join(errs...), name)
	return rgs.Groups
}

// requireOnlyForCut checks that a rule file whose alerts' for: were cut to maxFor (capFor)
// means what the original means, but for those for:, and reads as it does: line for line,
// comments and key order included, but for the blank lines, which the copy loses. It returns
// how many for: were cut.
func requireOnlyForCut(t *testing.T, name string, original, cut []byte, maxFor time.Duration) int {
	t.Helper()
	want := parseRuleBytes(t, name, original)
	got := parseRuleBytes(t, name+" (cut)", cut)
	require.Len(t, got, len(want), name)
	n := 0
	for i := range want {
		require.Len(t, got[i].Rules, len(want[i].Rules), "%s group %s", name, want[i].Name)
		for j, r := range want[i].Rules {
			require.Equal(t, min(time.Duration(r.For), maxFor), time.Duration(got[i].Rules[j].For), "%s group %s rule %s", name, want[i].Name, r.Alert)
			if time.Duration(r.For) > maxFor {
				n++
			}
			want[i].Rules[j].For, got[i].Rules[j].For = 0, 0
		}
	}
	require.Equal(t, want, got, "%s: the copy means more than its for: differently", name)

	nonBlank := func(raw []byte) []string {
		var lines []string
		for line := range strings.Lines(string(raw)) {
			if strings.TrimSpace(line) != "" {
				lines = append(lines, strings.TrimSuffix(line, "\n"))
			}
		}
		return lines
	}
	wantLines, gotLines := nonBlank(original), nonBlank(cut)
	require.Len(t, gotLines, len(wantLines), "%s: lines", name)
	// A rule's for: is indented as the key after the dash of its "- alert:"; a deeper one is
	// in its labels or annotations.
	alertLine, forLine := regexp.MustCompile(`^(\s*)- alert: `), regexp.MustCompile(`^(\s+for: )(\S+)$`)
	ruleIndent := -1
	for i, w := range wantLines {
		if m := alertLine.FindStringSubmatch(w); m != nil {
			ruleIndent = len(m[1]) + 2
		}
		if m := forLine.FindStringSubmatch(w); m != nil && len(m[1]) == ruleIndent+len("for: ") {
			d, err := model.ParseDuration(m[2])
			require.NoError(t, err, "%s line %q", name, w)
			if time.Duration(d) > maxFor {
				w = m[1] + model.Duration(maxFor).String()
			}
		}
		require.Equal(t, w, gotLines[i], "%s: non-blank line %d", name, i+1)
	}
	return n
}

// relayExposition returns the names of the series a relay exposes: the metrics of
// pkg/outbox/outboxmetrics.NewRelay and outboxrabbitmqmetrics.NewPublisher, histograms as their _bucket,
// _sum and _count.
func relayExposition(t *testing.T) []string {
	t.Helper()
	reg := prometheus.NewRegistry()
	_, err := outboxmetrics.NewRelay(reg, nil)
	require.NoError(t, err)
	_, err = outboxrabbitmqmetrics.NewPublisher(reg, nil)
	require.NoError(t, err)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		if mf.Metric[0].Histogram != nil {
			names = append(names, mf.GetName()+"_bucket", mf.GetName()+"_sum", mf.GetName()+"_count")
			continue
		}
		names = append(names, mf.GetName())
	}
	require.Contains(t, names, "outbox_published_total")
	return names
}

func readAny(t *testing.T, path string) any {
	t.Helper()
	var v any
	readInto(t, path, &v)
	return v
}

func readInto(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, v), path)
}

// rewriteStrings replaces, in a decoded YAML value, every compose address of the table by
// its local address, alone (a target) or as the host of a URL (a webhook).
func rewriteStrings(v any, tbl table) {
	rewrite := func(s string) string {
		if row, err := tbl.row(s); err == nil {
			return row.Local(tbl.layout)
		}
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			if row, err := tbl.row(u.Host); err == nil {
				u.Host = row.Local(tbl.layout)
				return u.String()
			}
		}
		return s
	}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok {
				v[k] = rewrite(s)
				continue
			}
			rewriteStrings(e, tbl)
		}
	case []any:
		for i, e := range v {
			if s, ok := e.(string); ok {
				v[i] = rewrite(s)
				continue
			}
			rewriteStrings(e, tbl)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
	require.NoError(t, os.WriteFile(to, raw, 0o644))
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
}

// TestDocs keeps docs/observe.md's link to the backlog graph the one make observe prints.
func TestDocs(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoDir, "docs", "observe.md"))
	require.NoError(t, err)
	require.Contains(t, string(raw), graphURL("http://localhost:9090", BacklogQuery))
}

func TestFindBinariesSaysWhatToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := FindBinaries()
	require.ErrorContains(t, err, "prometheus and alertmanager not found on the PATH")
	require.ErrorContains(t, err, "apt-get install prometheus prometheus-alertmanager")
}

// TestRun runs make observe's Prometheus and Alertmanager on the configuration of make run,
// pointed at servers of the test that serve what `orders all`, `warehouse all` and RabbitMQ
// do, and checks what the rules rely on: every job is scraped, the relay's metrics are
// stored under the relay jobs only and the others under the API jobs, the rules join a
// service's backlog with its relay, Prometheus found Alertmanager. Then it stops them.
func TestRun(t *testing.T) {
	t.Parallel()
	if _, err := FindBinaries(); err != nil {
		requireInstalled(t, err)
	}

	orders, warehouse := fakeAllProcess(t, "orders"), fakeAllProcess(t, "warehouse")
	rabbit := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "rabbitmq_build_info 1")
	}))
	t.Cleanup(rabbit.Close)
	local := func(compose string) string {
		switch compose {
		case "orders-api:8080", "orders-relay:8081":
			return orders
		case "warehouse:8090", "warehouse-relay:8091":
			return warehouse
		case "rabbitmq:15692":
			return rabbit.Listener.Addr().String()
		}
		return freeAddr(t)
	}
	var addrs []Address
	for _, a := range Addresses {
		a.All = local(a.Compose)
		addrs = append(addrs, a)
	}
	tbl := newTable(LayoutAll, addrs)
	cfg := Config{
		Options: Options{Deploy: deployDir, Dir: t.TempDir(), Layout: LayoutAll, Addresses: addrs, Interval: "1s"},
		Out:     &syncBuffer{},
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})

	prom := "http://" + tbl.local(composePrometheus)
	eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("Run returned before it was stopped: %v\n%s", err, cfg.Out)
		default:
		}
		if !strings.Contains(cfg.Out.(*syncBuffer).String(), "Ctrl-C stops") {
			return errors.New("Run has not printed the URLs yet")
		}
		return nil
	})
	require.Contains(t, cfg.Out.(*syncBuffer).String(), "Prometheus     http://localhost:")

	jobsOf := func(query string) func() (any, error) {
		return func() (any, error) {
			var jobs []string
			for _, s := range queryVector(t, prom, query) {
				jobs = append(jobs, s.Metric["job"]+"="+s.Value)
			}
			slices.Sort(jobs)
			return jobs, nil
		}
	}
	for _, tc := range []struct {
		name, query string
		want        []string
	}{
		{"every target up", "up", []string{
			"orders-api=1", "orders-relay=1", "rabbitmq-detailed=1", "rabbitmq=1", "warehouse-relay=1", "warehouse=1"}},
		{"relay metrics under the relay jobs", "count by (job) (outbox_published_total)", []string{"orders-relay=1", "warehouse-relay=1"}},
		{"histograms too", "count by (job) (outbox_commit_to_confirm_seconds_count)", []string{"orders-relay=1", "warehouse-relay=1"}},
		{"the backlog under the API jobs", "count by (job) (outbox_pending_messages)", []string{"orders-api=1", "warehouse=1"}},
		{"the process under the API jobs", "count by (job) (go_goroutines)", []string{"orders-api=1", "warehouse=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eventuallyEqual(t, 30*time.Second, tc.want, jobsOf(tc.query))
		})
	}
	t.Run("the rules join the backlog with the relay per service", func(t *testing.T) {
		eventuallyEqual(t, 30*time.Second, []string{"orders=0", "warehouse=0"}, func() (any, error) {
			var got []string
			for _, s := range queryVector(t, prom, "service:outbox_pending_messages:max * on (service) service:outbox_relay_up:max") {
				got = append(got, s.Metric["service"]+"="+s.Value)
			}
			slices.Sort(got)
			return got, nil
		})
	})
	t.Run("Alertmanager found", func(t *testing.T) {
		eventuallyEqual(t, 30*time.Second, []string{"http://" + tbl.local(composeAlertmanager) + "/api/v2/alerts"}, func() (any, error) {
			var resp struct {
				Data struct {
					Active []struct {
						URL string `json:"url"`
					} `json:"activeAlertmanagers"`
				} `json:"data"`
			}
			if err := getJSON(t, prom+"/api/v1/alertmanagers", &resp); err != nil {
				return nil, err
			}
			var urls []string
			for _, a := range resp.Data.Active {
				urls = append(urls, a.URL)
			}
			return urls, nil
		})
	})

	cancel()
	select {
	case err := <-done:
		stopped = true
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30 s after it was stopped")
	}
	for _, addr := range []string{tbl.local(composePrometheus), tbl.local(composeAlertmanager)} {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		require.Error(t, err, "%s still listens after Run returned", addr)
	}
}

// fakeAllProcess serves on a port of its own the metrics that `<service> all` registers as
// far as the rules care: the relay's, the publisher's, the outbox table's (API) and the Go
// collector's, with the service label. It returns its address.
func fakeAllProcess(t *testing.T, service string) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"service": service}
	_, err := outboxmetrics.NewRelay(reg, labels)
	require.NoError(t, err)
	_, err = outboxrabbitmqmetrics.NewPublisher(reg, labels)
	require.NoError(t, err)
	// Registered, never read: the gauges stay at 0, a backlog of none.
	_, err = outboxmetrics.NewStats(reg, nil, outboxmetrics.StatsConfig{ConstLabels: labels})
	require.NoError(t, err)
	require.NoError(t, reg.Register(collectors.NewGoCollector()))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// freeAddr is a 127.0.0.1 address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// sample is one element of an instant vector.
type sample struct {
	Metric map[string]string
	Value  string
}

func queryVector(t *testing.T, prom, query string) []sample {
	t.Helper()
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(t, prom+"/api/v1/query?"+url.Values{"query": {query}}.Encode(), &resp); err != nil {
		return nil
	}
	var out []sample
	for _, r := range resp.Data.Result {
		out = append(out, sample{Metric: r.Metric, Value: fmt.Sprint(r.Value[1])})
	}
	return out
}

func getJSON(t *testing.T, u string, v any) error {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// eventually polls check until it returns nil, and fails with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// eventuallyEqual polls get until it returns want.
func eventuallyEqual(t *testing.T, timeout time.Duration, want any, get func() (any, error)) {
	t.Helper()
	eventually(t, timeout, func() error {
		got, err := get()
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	})
}

// syncBuffer is a bytes.Buffer that Run and the test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

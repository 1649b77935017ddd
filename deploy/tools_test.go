package deploy

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// tool returns the path of a command-line tool. Without it the test skips, except under
// CI=true, where .ci/run installs it and its absence is a failure.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	const install = "install it with: apt-get install prometheus prometheus-alertmanager (Debian, Ubuntu)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not on the PATH and CI=true: %s", name, install)
	}
	t.Skipf("%s is not on the PATH, skipping (CI=true makes this a failure); %s", name, install)
	return ""
}

// run runs a tool and fails with its output when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}

func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool")

	t.Run("check config", func(t *testing.T) {
		t.Parallel()
		run(t, promtool, "check", "config", prometheusConfig)
	})
	t.Run("check rules", func(t *testing.T) {
		t.Parallel()
		run(t, promtool, append([]string{"check", "rules"}, glob(t, rulesGlob)...)...)
	})
	t.Run("test rules", func(t *testing.T) {
		t.Parallel()
		run(t, promtool, append([]string{"test", "rules"}, glob(t, ruleTestsGlob)...)...)
	})
}

func TestAmtool(t *testing.T) {
	t.Parallel()
	amtool := tool(t, "amtool")

	t.Run("check-config", func(t *testing.T) {
		t.Parallel()
		run(t, amtool, "check-config", alertmanagerConfig)
	})

	for _, tt := range []struct{ severity, receiver string }{
		{"page", "page"},
		{"ticket", "ticket"},
		{"info", "null"},
		{"", "ticket"}, // no severity: a person still sees it
	} {
		t.Run("route severity="+tt.severity, func(t *testing.T) {
			t.Parallel()
			out := run(t, amtool, "config", "routes", "test", "--config.file="+alertmanagerConfig,
				"alertname=OutboxRelayStalled", "job=orders-relay", "severity="+tt.severity)
			require.Equal(t, tt.receiver, lastLine(out))
		})
	}
}

// lastLine is the last non-empty line of a tool's output; amtool prints warnings before the
// answer.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.HasPrefix(l, "Warning:") {
			return l
		}
	}
	return ""
}

// TestPrometheusConfig checks what the rules and dashboards rely on: the job names, the
// RabbitMQ per-queue endpoint, the rule files and the Alertmanager address.
func TestPrometheusConfig(t *testing.T) {
	t.Parallel()

	raw, err := os.ReadFile(prometheusConfig)
	require.NoError(t, err)
	var cfg struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		Alerting struct {
			Alertmanagers []struct {
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"alertmanagers"`
		} `yaml:"alerting"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string              `yaml:"job_name"`
			MetricsPath   string              `yaml:"metrics_path"`
			Params        map[string][]string `yaml:"params"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
				Labels  map[string]string
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg))

	require.Equal(t, "15s", cfg.Global.ScrapeInterval)
	require.Equal(t, "15s", cfg.Global.EvaluationInterval)
	require.Equal(t, []string{"rules/*.yml"}, cfg.RuleFiles)
	require.Len(t, cfg.Alerting.Alertmanagers, 1)
	require.Equal(t, []string{"alertmanager:9093"}, cfg.Alerting.Alertmanagers[0].StaticConfigs[0].Targets)

	type job struct {
		target, path string
		params       map[string][]string
	}
	want := map[string]job{
		"orders-api":        {target: "orders-api:8080"},
		"orders-relay":      {target: "orders-relay:8081"},
		"warehouse":         {target: "warehouse:8090"},
		"warehouse-relay":   {target: "warehouse-relay:8091"},
		"rabbitmq":          {target: "rabbitmq:15692", path: "/metrics"},
		"rabbitmq-detailed": {target: "rabbitmq:15692", path: "/metrics/detailed", params: map[string][]string{"family": {"queue_coarse_metrics", "queue_consumer_count"}}},
	}
	got := map[string]job{}
	for _, sc := range cfg.ScrapeConfigs {
		require.Len(t, sc.StaticConfigs, 1, sc.JobName)
		require.Len(t, sc.StaticConfigs[0].Targets, 1, sc.JobName)
		require.Empty(t, sc.StaticConfigs[0].Labels, "%s: no constant labels, the job says it all", sc.JobName)
		got[sc.JobName] = job{target: sc.StaticConfigs[0].Targets[0], path: sc.MetricsPath, params: sc.Params}
	}
	require.Equal(t, want, got)
}

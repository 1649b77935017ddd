package e2e_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The monitoring configuration of deploy/, relative to this package's folder (go test runs
// there).
const (
	deployDir              = "../deploy"
	deployPrometheusConfig = "../deploy/prometheus/prometheus.yml"
	deployDashboardsGlob   = "../deploy/grafana/dashboards/*.json"
)

// promql parses expressions as Prometheus does by default.
var promql = parser.NewParser(parser.Options{})

// monitoring is what deploy/ asks of a running shop: the rule files Prometheus loads and
// every PromQL expression of the rules and the dashboards.
type monitoring struct {
	// ruleFiles are the files prometheus.yml's rule_files match, as paths relative to the
	// configuration's folder (rules/outbox.yml), with their parsed groups.
	ruleFiles []ruleFile
	// exprs are the distinct expressions, Grafana variables substituted, in file order.
	exprs []expression
}

type ruleFile struct {
	rel    string
	groups []rulefmt.RuleGroup
}

// expression is one PromQL expression and every place that uses it.
type expression struct {
	expr   string
	where  []string
	parsed parser.Expr
}

// alertRule returns the alerting rules named name; it fails the test when there is none, so
// that a renamed alert is noticed here.
func (m *monitoring) alertRule(t *testing.T, name string) []rulefmt.Rule {
	t.Helper()
	var rules []rulefmt.Rule
	for _, f := range m.ruleFiles {
		for _, g := range f.groups {
			for _, r := range g.Rules {
				if r.Alert == name {
					rules = append(rules, r)
				}
			}
		}
	}
	require.NotEmpty(t, rules, "no alerting rule %s in the rule files of %s", name, deployPrometheusConfig)
	return rules
}

// metricUse is a metric name that the expressions select, and the selectors that do.
type metricUse struct {
	name      string
	selectors []string // as written after substitution, e.g. up{job=~".*"}
	where     []string
}

// metrics returns every metric name the expressions select, sorted.
func (m *monitoring) metrics() []metricUse {
	byName := map[string]*metricUse{}
	for _, e := range m.exprs {
		for _, vs := range vectorSelectors(e.parsed) {
			name := selectorName(vs)
			u := byName[name]
			if u == nil {
				u = &metricUse{name: name}
				byName[name] = u
			}
			if s := vs.String(); !slices.Contains(u.selectors, s) {
				u.selectors = append(u.selectors, s)
			}
			for _, w := range e.where {
				if !slices.Contains(u.where, w) {
					u.where = append(u.where, w)
				}
			}
		}
	}
	out := make([]metricUse, 0, len(byName))
	for _, u := range byName {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b metricUse) int { return strings.Compare(a.name, b.name) })
	return out
}

// loadMonitoring reads prometheus.yml's rule files and the dashboards, and parses every
// expression. It fails the test on anything that does not parse: there is no point in
// starting the shop for a configuration that cannot load.
func loadMonitoring(t *testing.T) *monitoring {
	t.Helper()
	m := &monitoring{}
	index := map[string]int{}
	add := func(expr, where string) {
		if i, ok := index[expr]; ok {
			m.exprs[i].where = append(m.exprs[i].where, where)
			return
		}
		parsed, err := promql.ParseExpr(expr)
		require.NoError(t, err, "%s:\n%s", where, expr)
		_, err = metricNames(parsed)
		require.NoError(t, err, "%s:\n%s", where, expr)
		index[expr] = len(m.exprs)
		m.exprs = append(m.exprs, expression{expr: expr, where: []string{where}, parsed: parsed})
	}

	files, err := ruleFilesOf(deployPrometheusConfig)
	require.NoError(t, err)
	require.NotEmpty(t, files, "%s loads no rule file", deployPrometheusConfig)
	for _, rel := range files {
		groups, err := parseRules(filepath.Join(filepath.Dir(deployPrometheusConfig), rel))
		require.NoError(t, err)
		m.ruleFiles = append(m.ruleFiles, ruleFile{rel: rel, groups: groups})
		for _, g := range groups {
			for _, r := range g.Rules {
				add(r.Expr, fmt.Sprintf("%s group %s rule %s", rel, g.Name, cmp.Or(r.Record, r.Alert)))
			}
		}
	}

	dashboards, err := filepath.Glob(deployDashboardsGlob)
	require.NoError(t, err)
	require.NotEmpty(t, dashboards, "no dashboard matches %s", deployDashboardsGlob)
	for _, path := range dashboards {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var d map[string]any
		require.NoError(t, json.Unmarshal(raw, &d), path)
		queries := dashboardQueries(d)
		require.NotEmpty(t, queries, "%s has no query", path)
		for _, q := range queries {
			add(substituteGrafanaVariables(q.expr), filepath.Base(path)+" "+q.where)
		}
	}
	return m
}

// ruleFilesOf returns the files a Prometheus configuration's rule_files globs match, relative
// to the configuration's folder (which is what Prometheus resolves them against).
func ruleFilesOf(configPath string) ([]string, error) {
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", configPath, err)
	}
	dir := filepath.Dir(configPath)
	var files []string
	for _, pattern := range cfg.RuleFiles {
		if filepath.IsAbs(pattern) {
			return nil, fmt.Errorf("%s: rule_files pattern %q is absolute; the test copies rule files next to a generated configuration", configPath, pattern)
		}
		matches, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, fmt.Errorf("%s: rule_files %q: %w", configPath, pattern, err)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("%s: rule_files %q matches nothing", configPath, pattern)
		}
		for _, match := range matches {
			rel, err := filepath.Rel(dir, match)
			if err != nil {
				return nil, err
			}
			files = append(files, rel)
		}
	}
	return files, nil
}

// parseRules parses and validates a rule file the way Prometheus does.
func parseRules(path string) ([]rulefmt.RuleGroup, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseRuleBytes(path, raw)
}

func parseRuleBytes(name string, raw []byte) ([]rulefmt.RuleGroup, error) {
	rgs, errs := rulefmt.Parse(raw, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return rgs.Groups, nil
}

// dashboardQuery is one expression of a dashboard, with where it is.
type dashboardQuery struct {
	where, expr string
}

// dashboardQueries returns the expression of every panel target (panels nested in rows
// included) and of every annotation.
func dashboardQueries(d map[string]any) []dashboardQuery {
	var qs []dashboardQuery
	var walk func(list any)
	walk = func(list any) {
		items, _ := list.([]any)
		for _, item := range items {
			p, ok := item.(map[string]any)
			if !ok {
				continue
			}
			targets, _ := p["targets"].([]any)
			for _, tg := range targets {
				target, _ := tg.(map[string]any)
				if expr, _ := target["expr"].(string); expr != "" {
					qs = append(qs, dashboardQuery{where: fmt.Sprintf("panel %q target %v", p["title"], target["refId"]), expr: expr})
				}
			}
			walk(p["panels"])
		}
	}
	walk(d["panels"])
	annotations, _ := d["annotations"].(map[string]any)
	list, _ := annotations["list"].([]any)
	for _, a := range list {
		a, _ := a.(map[string]any)
		if expr, _ := a["expr"].(string); expr != "" {
			qs = append(qs, dashboardQuery{where: fmt.Sprintf("annotation %q", a["name"]), expr: expr})
		}
	}
	return qs
}

var (
	// grafanaIntervals are Grafana's interval variables, as windows that hold several samples
	// at the test's 1 s scrape interval.
	grafanaIntervals = strings.NewReplacer(
		"${__rate_interval}", "10s", "$__rate_interval", "10s",
		"${__interval}", "2s", "$__interval", "2s",
		"${__range}", "1m", "$__range", "1m",
	)
	// grafanaVariable is a dashboard variable: $name, ${name}, ${name:format} or [[name]].
	// A name starts with a letter or _, so label_replace's $1 is not one.
	grafanaVariable = regexp.MustCompile(`\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)(?::\w+)?\]\]`)
	// labelMatcher is a label matcher with its operator and quoted value.
	labelMatcher = regexp.MustCompile(`([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
)

// substituteGrafanaVariables turns a dashboard expression into the PromQL Grafana would send
// with "All" selected: the interval variables become durations, $datasource disappears, and
// any other variable inside a label matcher becomes .* (the matcher becoming a regex one if it
// was not). A variable anywhere else stays .*, which the server will reject: such a query
// needs a value this test does not know.
func substituteGrafanaVariables(expr string) string {
	expr = grafanaIntervals.Replace(expr)
	expr = grafanaVariable.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVariable.FindStringSubmatch(v)
		if cmp.Or(m[1], m[2], m[3]) == "datasource" {
			return ""
		}
		return v
	})
	expr = labelMatcher.ReplaceAllStringFunc(expr, func(s string) string {
		m := labelMatcher.FindStringSubmatch(s)
		name, op, value := m[1], m[2], m[3]
		if !grafanaVariable.MatchString(value) {
			return s
		}
		switch op {
		case "=":
			op = "=~"
		case "!=":
			op = "!~"
		}
		return name + op + `"` + grafanaVariable.ReplaceAllString(value, ".*") + `"`
	})
	return grafanaVariable.ReplaceAllString(expr, ".*")
}

// vectorSelectors returns the vector selectors of an expression, those inside range
// selectors and subqueries included.
func vectorSelectors(expr parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// selectorName is the metric name a selector fixes: its name, or its __name__="…" matcher;
// "" when it has neither.
func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel && m.Type.String() == "=" {
			return m.Value
		}
	}
	return ""
}

// metricNames returns the metric names an expression selects. A selector without a fixed
// name is an error: nothing could say which metric has to exist.
func metricNames(expr parser.Expr) ([]string, error) {
	var names []string
	var errs []error
	for _, vs := range vectorSelectors(expr) {
		name := selectorName(vs)
		if name == "" {
			errs = append(errs, fmt.Errorf("selector %s has no fixed metric name", vs))
			continue
		}
		names = append(names, name)
	}
	return names, errors.Join(errs...)
}

func TestObservabilityGrafanaVariables(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ in, want string }{
		{`rate(x{job=~"$service.*"}[$__rate_interval])`, `rate(x{job=~".*.*"}[10s])`},
		{`increase(x[${__rate_interval}])`, `increase(x[10s])`},
		{`max_over_time(x[$__range]) + avg_over_time(x[$__interval])`, `max_over_time(x[1m]) + avg_over_time(x[2s])`},
		{`x{job="$service",instance!="${instance:regex}",route=~"[[route]]"}`, `x{job=~".*",instance!~".*",route=~".*"}`},
		{`x{ds="$datasource${datasource}"}`, `x{ds=""}`},
		{`label_replace(x{job="a"}, "service", "$1", "job", "(.+)")`, `label_replace(x{job="a"}, "service", "$1", "job", "(.+)")`},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, substituteGrafanaVariables(tt.in))
		})
	}
}

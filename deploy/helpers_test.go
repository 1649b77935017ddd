package deploy

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// Paths, relative to this package's folder (go test runs there).
const (
	prometheusConfig   = "prometheus/prometheus.yml"
	rulesGlob          = "prometheus/rules/*.yml"
	ruleTestsGlob      = "prometheus/tests/*.yml"
	rabbitmqFixture    = "prometheus/testdata/rabbitmq_metrics.txt"
	alertmanagerConfig = "alertmanager/alertmanager.yml"
	dashboardsGlob     = "grafana/dashboards/*.json"
	metricsDoc         = "../docs/metrics.md"
	runbookDoc         = "../docs/runbook.md"

	// runbookURL is the prefix of every alert's runbook_url; the anchor follows.
	runbookURL = "https://github.com/outboxshop/outboxshop/blob/main/docs/runbook.md"
)

// promql parses expressions as Prometheus does by default.
var promql = parser.NewParser(parser.Options{})

func glob(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	require.NoError(t, err)
	require.NotEmpty(t, files, "no file matches %s", pattern)
	return files
}

// ruleFile is one file of prometheus/rules.
type ruleFile struct {
	path   string
	groups []rulefmt.RuleGroup
}

// loadRules parses and validates every rule file the way Prometheus does.
func loadRules(t *testing.T) []ruleFile {
	t.Helper()
	var files []ruleFile
	for _, path := range glob(t, rulesGlob) {
		rgs, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
		require.Empty(t, errs, "%s", path)
		files = append(files, ruleFile{path: path, groups: rgs.Groups})
	}
	return files
}

// alertRules returns every alerting rule, in file order.
func alertRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	var rules []rulefmt.Rule
	for _, f := range loadRules(t) {
		for _, g := range f.groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					rules = append(rules, r)
				}
			}
		}
	}
	require.NotEmpty(t, rules)
	return rules
}

// dashboard is a Grafana dashboard as decoded from its JSON file.
type dashboard struct {
	path string
	raw  []byte
	json map[string]any
}

func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	var ds []dashboard
	for _, path := range glob(t, dashboardsGlob) {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &m), "%s", path)
		ds = append(ds, dashboard{path: path, raw: raw, json: m})
	}
	return ds
}

// panels returns every panel of the dashboard, those nested in rows included.
func (d dashboard) panels() []map[string]any {
	var out []map[string]any
	var walk func(list any)
	walk = func(list any) {
		items, _ := list.([]any)
		for _, item := range items {
			p, ok := item.(map[string]any)
			if !ok {
				continue
			}
			out = append(out, p)
			walk(p["panels"])
		}
	}
	walk(d.json["panels"])
	return out
}

// variables returns the dashboard's template variables.
func (d dashboard) variables() []map[string]any {
	templating, _ := d.json["templating"].(map[string]any)
	list, _ := templating["list"].([]any)
	var out []map[string]any
	for _, v := range list {
		if m, ok := v.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// annotations returns the dashboard's annotation queries, the built-in one included.
func (d dashboard) annotations() []map[string]any {
	annotations, _ := d.json["annotations"].(map[string]any)
	list, _ := annotations["list"].([]any)
	var out []map[string]any
	for _, a := range list {
		if m, ok := a.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// query is one PromQL expression found in the configuration, with where it was found.
type query struct {
	where string
	expr  string
}

// dashboardQueries returns the expressions of every panel target and annotation.
func (d dashboard) queries() []query {
	var qs []query
	for _, p := range d.panels() {
		targets, _ := p["targets"].([]any)
		for _, tg := range targets {
			target, _ := tg.(map[string]any)
			if expr, _ := target["expr"].(string); expr != "" {
				qs = append(qs, query{where: fmt.Sprintf("panel %q target %v", p["title"], target["refId"]), expr: expr})
			}
		}
	}
	for _, a := range d.annotations() {
		if expr, _ := a["expr"].(string); expr != "" {
			qs = append(qs, query{where: fmt.Sprintf("annotation %q", a["name"]), expr: expr})
		}
	}
	return qs
}

var (
	grafanaBuiltins = strings.NewReplacer(
		"${__rate_interval}", "1m", "$__rate_interval", "1m",
		"${__interval}", "1m", "$__interval", "1m",
		"${__range}", "1h", "$__range", "1h",
	)
	grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)
)

// substituteGrafanaVariables turns a dashboard expression into plain PromQL: the interval
// variables become durations, the datasource variable disappears, and any other variable
// becomes .* (variables are only used inside regex matchers).
func substituteGrafanaVariables(expr string) string {
	expr = grafanaBuiltins.Replace(expr)
	return grafanaVariable.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVariable.FindStringSubmatch(v)
		if cmp.Or(m[1], m[2], m[3]) == "datasource" {
			return ""
		}
		return ".*"
	})
}

// metricNames returns the metric names the expression's selectors use. A selector without a
// fixed name is an error: it could match anything.
func metricNames(expr parser.Expr) ([]string, error) {
	var names []string
	var errs []error
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type.String() == "=" {
					name = m.Value
				}
			}
		}
		if name == "" {
			errs = append(errs, fmt.Errorf("selector %s has no fixed metric name", vs))
			return nil
		}
		names = append(names, name)
		return nil
	})
	return names, errors.Join(errs...)
}

// knownMetrics maps every metric name an expression may use to where it comes from. It is
// built once per test binary.
var knownMetrics = sync.OnceValues(func() (map[string]string, error) {
	known := map[string]string{
		"up":               "Prometheus",
		"ALERTS":           "Prometheus",
		"ALERTS_FOR_STATE": "Prometheus",
	}
	add := func(source string, names []string) {
		for _, n := range names {
			if _, ok := known[n]; !ok {
				known[n] = source
			}
		}
	}

	outboxNames, err := outboxMetricNames()
	if err != nil {
		return nil, fmt.Errorf("pkg/outbox/outboxmetrics: %w", err)
	}
	add("pkg/outbox/outboxmetrics", outboxNames)

	inboxNames, err := inboxMetricNames()
	if err != nil {
		return nil, fmt.Errorf("pkg/inbox/inboxmetrics: %w", err)
	}
	add("pkg/inbox/inboxmetrics", inboxNames)

	runtimeNames, err := gatherNames(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err != nil {
		return nil, fmt.Errorf("Go and process collectors: %w", err)
	}
	add("Go and process collectors", runtimeNames)

	doc, err := parseMetricsDoc(metricsDoc)
	if err != nil {
		return nil, err
	}
	add(metricsDoc+" (Services)", doc.services)

	rabbit, err := rabbitmqMetricNames(rabbitmqFixture)
	if err != nil {
		return nil, err
	}
	add(rabbitmqFixture, rabbit)
	return known, nil
})

// outboxMetricNames registers the relay and table metrics of pkg/outbox/outboxmetrics and the
// publisher metrics of pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics on a fresh registry, calls each
// hook once so that every vector has a series, and gathers the names.
func outboxMetricNames() ([]string, error) {
	reg := prometheus.NewRegistry()
	relay, err := outboxmetrics.NewRelay(reg, prometheus.Labels{"service": "orders"})
	if err != nil {
		return nil, err
	}
	now := time.Now()
	hooks := relay.Hooks(outbox.Hooks{})
	hooks.Polled(outbox.Poll{Claimed: 2})
	hooks.BatchDone(outbox.BatchResult{
		Published:   []outbox.Message{{CreatedAt: now.Add(-time.Second)}},
		ConfirmedAt: now,
		Failed:      []outbox.Failure{{Err: errors.New("retried")}, {Err: errors.New("dead"), Dead: true}},
		Untouched:   1,
	})
	hooks.StateChanged(outbox.StateChange{From: outbox.StateStarting, To: outbox.StateRunning})
	publisher, err := outboxrabbitmqmetrics.NewPublisher(reg, prometheus.Labels{"service": "orders"})
	if err != nil {
		return nil, err
	}
	publisher.Hooks(outboxrabbitmq.Hooks{}).Connected(outboxrabbitmq.ConnectionChange{Up: true})
	// The table metrics are plain gauges: registering them is enough (no read, no database).
	// A partitioned table's add outbox_partitions_ahead_seconds.
	if _, err := outboxmetrics.NewStats(reg, nil, outboxmetrics.StatsConfig{
		Tables: outbox.Tables{Partition: time.Hour}, ConstLabels: prometheus.Labels{"service": "orders"}}); err != nil {
		return nil, err
	}
	return gather(reg)
}

// inboxMetricNames does the same for pkg/inbox/inboxmetrics and
// pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics.
func inboxMetricNames() ([]string, error) {
	reg := prometheus.NewRegistry()
	c, err := inboxrabbitmqmetrics.NewConsumer(reg, inboxrabbitmqmetrics.Config{KnownTypes: []string{"OrderCreated"}})
	if err != nil {
		return nil, err
	}
	c.Init("warehouse")
	w, err := inboxmetrics.NewWindow(reg, nil)
	if err != nil {
		return nil, err
	}
	w.Set("warehouse", 7*24*time.Hour, time.Hour)
	// A partitioned table's partitions: plain gauges, registered without a read.
	if _, err := inboxmetrics.NewPartitions(reg, nil, inboxmetrics.PartitionsConfig{Tables: inbox.Tables{Partition: 24 * time.Hour}}); err != nil {
		return nil, err
	}
	hooks := c.Hooks(inboxrabbitmq.Hooks{})
	hooks.Processed(inboxrabbitmq.ProcessedMessage{Consumer: "warehouse", Type: "OrderCreated", Duration: time.Millisecond})
	hooks.Processed(inboxrabbitmq.ProcessedMessage{Consumer: "warehouse", Type: "OrderCreated", Duplicate: true, Duration: time.Millisecond})
	hooks.HandlerError(inboxrabbitmq.HandlerFailure{Consumer: "warehouse", Type: "OrderCreated", Err: errors.New("boom")})
	hooks.Retried(inboxrabbitmq.Retry{Consumer: "warehouse", Type: "OrderCreated", DeliveryCount: 1})
	hooks.DeadLettered(inboxrabbitmq.DeadLetter{Consumer: "warehouse", Type: "OrderCreated", Reason: inboxrabbitmq.ReasonPermanent})
	hooks.Connected(inboxrabbitmq.ConnectionChange{Consumer: "warehouse", Up: true})
	return gather(reg)
}

func gatherNames(cs ...prometheus.Collector) ([]string, error) {
	reg := prometheus.NewRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return gather(reg)
}

// gather returns the series names of a registry's families: a histogram's _bucket, _sum and
// _count, a summary's own name with _sum and _count.
func gather(g prometheus.Gatherer) ([]string, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, seriesNames(mf.GetName(), mf.GetType())...)
	}
	return names, nil
}

func seriesNames(name string, typ dto.MetricType) []string {
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		return []string{name + "_bucket", name + "_sum", name + "_count"}
	case dto.MetricType_SUMMARY:
		return []string{name, name + "_sum", name + "_count"}
	default:
		return []string{name}
	}
}

// metricsDocument is what docs/metrics.md lists.
type metricsDocument struct {
	// library holds the series names of the pkg/outbox and pkg/inbox sections.
	library []string
	// services holds the series names of the Services section: the contract the services'
	// own registries must meet (an end-to-end test checks them against the running
	// services). Names ending in * (go_*, process_*) are families the Go collectors provide;
	// their prefixes are in wildcards.
	services  []string
	wildcards []string
}

var (
	docSection = regexp.MustCompile(`^## (.+)$`)
	docCode    = regexp.MustCompile("`([^`]+)`")
)

// parseMetricsDoc reads the tables of docs/metrics.md: the first cell names the metric (in
// backticks), the second gives its type. A pgxpool_* style row lists its names in backticks
// in its other cells.
func parseMetricsDoc(path string) (metricsDocument, error) {
	f, err := os.Open(path)
	if err != nil {
		return metricsDocument{}, err
	}
	defer f.Close()
	var doc metricsDocument
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := docSection.FindStringSubmatch(line); m != nil {
			section = m[1]
			continue
		}
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "| ---") || strings.HasPrefix(line, "| name") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 2 {
			continue
		}
		typ := dto.MetricType_UNTYPED
		if strings.Contains(cells[1], "histogram") {
			typ = dto.MetricType_HISTOGRAM
		}
		var names []string
		for _, m := range docCode.FindAllStringSubmatch(cells[0], -1) {
			name := m[1]
			prefix, wildcard := strings.CutSuffix(name, "*")
			if !wildcard {
				names = append(names, seriesNames(name, typ)...)
				continue
			}
			listed := false
			for _, other := range docCode.FindAllStringSubmatch(strings.Join(cells[1:], "|"), -1) {
				if strings.HasPrefix(other[1], prefix) && model.IsValidLegacyMetricName(other[1]) {
					names = append(names, other[1])
					listed = true
				}
			}
			if !listed {
				doc.wildcards = append(doc.wildcards, prefix)
			}
		}
		switch {
		case strings.HasPrefix(section, "pkg/"):
			doc.library = append(doc.library, names...)
		case section == "Services":
			doc.services = append(doc.services, names...)
		}
	}
	if err := sc.Err(); err != nil {
		return metricsDocument{}, err
	}
	if len(doc.library) == 0 || len(doc.services) == 0 {
		return metricsDocument{}, fmt.Errorf("%s: no metric table found under pkg/... or Services", path)
	}
	return doc, nil
}

// rabbitmqMetricNames reads the names in a capture of the rabbitmq_prometheus endpoints:
// the # TYPE lines (families without samples included) and the sample lines.
func rabbitmqMetricNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return scrapeNames(f)
}

func scrapeNames(r io.Reader) ([]string, error) {
	types := map[string]dto.MetricType{
		"counter": dto.MetricType_COUNTER, "gauge": dto.MetricType_GAUGE, "summary": dto.MetricType_SUMMARY,
		"histogram": dto.MetricType_HISTOGRAM, "untyped": dto.MetricType_UNTYPED,
	}
	var names []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) == 4 && fields[0] == "#" && fields[1] == "TYPE" {
			typ, ok := types[fields[3]]
			if !ok {
				return nil, fmt.Errorf("unknown metric type in %q", line)
			}
			names = append(names, seriesNames(fields[2], typ)...)
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names = append(names, line[:i])
		}
	}
	if len(names) == 0 {
		return nil, errors.New("no metric found")
	}
	return names, sc.Err()
}

// runbookAnchors returns the GitHub anchors of the ## headings of docs/runbook.md.
func runbookAnchors(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(runbookDoc)
	require.NoError(t, err)
	var anchors []string
	for line := range strings.Lines(string(raw)) {
		if heading, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "## "); ok {
			anchors = append(anchors, githubAnchor(heading))
		}
	}
	return anchors
}

var anchorDrop = regexp.MustCompile(`[^\p{L}\p{N}\s_-]`)

// githubAnchor is the anchor GitHub gives a heading: lower case, punctuation other than - and
// _ dropped, spaces turned into -.
func githubAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = anchorDrop.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// containsAll reports whether every key of want has the same value in got.
func containsAll(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

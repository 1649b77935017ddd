package observe

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/outboxshop/outboxshop/pkg/outbox/outboxmetrics"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

// The sources, relative to the deploy folder, and what Generate writes, relative to the
// scratch folder.
const (
	sourcePrometheus   = "prometheus/prometheus.yml"
	sourceAlertmanager = "alertmanager/alertmanager.yml"

	PrometheusConfig   = "prometheus/prometheus.yml"
	AlertmanagerConfig = "alertmanager/alertmanager.yml"
)

// Options say what Generate writes where.
type Options struct {
	// Deploy is the deploy folder of the repository, which holds the compose configuration.
	Deploy string
	// Dir is the scratch folder the configuration is written to (.observe).
	Dir string
	// Layout is how the shop runs: LayoutAll (make run) when empty.
	Layout Layout
	// Addresses replaces the table of local addresses; nil: [Addresses]. Tests point the
	// targets at servers of their own.
	Addresses []Address
	// Interval, when set, replaces the scrape and rule evaluation intervals, a job's own
	// scrape_interval included, and drops every scrape_timeout, which then defaults to the
	// interval (a test that cannot wait 15 s). Empty keeps the compose configuration's.
	Interval string
	// MaxFor, when set, cuts every alert's for: longer than MaxFor to MaxFor in the copies of
	// the rule files, and changes nothing else in them: comments and key order survive (a test
	// that cannot wait minutes for an alert). Zero copies the rule files unchanged.
	MaxFor time.Duration
}

func (o Options) addresses() []Address {
	if o.Addresses == nil {
		return Addresses
	}
	return o.Addresses
}

func (o Options) table() table {
	return newTable(cmp.Or(o.Layout, LayoutAll), o.addresses())
}

// Generate writes the configuration of Prometheus and Alertmanager for the shop on this
// machine into o.Dir: PrometheusConfig with the rule files it names copied next to it, and
// AlertmanagerConfig. Every address of the compose configuration is rewritten through the
// table; one it does not know is an error.
func Generate(o Options) error {
	if o.MaxFor < 0 {
		return fmt.Errorf("MaxFor %s: want a positive duration, or zero to keep every for:", o.MaxFor)
	}
	t := o.table()
	if err := generatePrometheus(o, t); err != nil {
		return fmt.Errorf("prometheus configuration: %w", err)
	}
	if err := generateAlertmanager(o, t); err != nil {
		return fmt.Errorf("alertmanager configuration: %w", err)
	}
	return nil
}

func generatePrometheus(o Options, t table) error {
	src := filepath.Join(o.Deploy, sourcePrometheus)
	doc, root, err := readYAML(src)
	if err != nil {
		return err
	}
	relay, err := relayMetricsRegex()
	if err != nil {
		return err
	}

	if o.Interval != "" {
		global := mapValue(root, "global")
		if global == nil {
			return fmt.Errorf("%s: no global section", src)
		}
		for _, key := range []string{"scrape_interval", "evaluation_interval"} {
			setScalar(global, key, o.Interval)
		}
		deleteKey(global, "scrape_timeout")
	}

	for _, am := range seq(mapValue(mapValue(root, "alerting"), "alertmanagers")) {
		if _, err := rewriteTargets(am, t); err != nil {
			return fmt.Errorf("%s: alertmanagers: %w", src, err)
		}
	}

	jobs := seq(mapValue(root, "scrape_configs"))
	if len(jobs) == 0 {
		return fmt.Errorf("%s: no scrape_configs", src)
	}
	for _, job := range jobs {
		name := scalar(mapValue(job, "job_name"))
		if err := onlyStaticTargets(job); err != nil {
			return fmt.Errorf("%s: job %s: %w", src, name, err)
		}
		if o.Interval != "" {
			if mapValue(job, "scrape_interval") != nil {
				setScalar(job, "scrape_interval", o.Interval)
			}
			deleteKey(job, "scrape_timeout")
		}
		rows, err := rewriteTargets(job, t)
		if err != nil {
			return fmt.Errorf("%s: job %s: %w", src, name, err)
		}
		if err := splitSharedTarget(job, t, rows, relay); err != nil {
			return fmt.Errorf("%s: job %s: %w", src, name, err)
		}
	}

	doc.HeadComment = header(sourcePrometheus, t.layout)
	if o.MaxFor > 0 {
		doc.HeadComment += fmt.Sprintf("\n#\n# In the rule files, every alert's for: longer than %s is cut to %s.", model.Duration(o.MaxFor), model.Duration(o.MaxFor))
	}
	// The file's own head comment speaks of compose host names; the header replaces it.
	if len(root.Content) > 0 {
		root.Content[0].HeadComment = ""
	}
	if err := copyRuleFiles(o, root); err != nil {
		return err
	}
	return writeYAML(filepath.Join(o.Dir, PrometheusConfig), doc)
}

// onlyStaticTargets fails for a job whose targets the generator cannot rewrite: one that
// discovers them (a *_sd_configs key), or one without a static target, which would be
// scraped at compose host names that do not resolve here, or not at all.
func onlyStaticTargets(job *yaml.Node) error {
	for i := 0; i+1 < len(job.Content); i += 2 {
		if key := job.Content[i].Value; strings.HasSuffix(key, "_sd_configs") {
			return fmt.Errorf("uses %s: only static_configs targets are rewritten to local addresses", key)
		}
	}
	for _, sc := range seq(mapValue(job, "static_configs")) {
		if len(seq(mapValue(sc, "targets"))) > 0 {
			return nil
		}
	}
	return errors.New("has no static_configs target to rewrite to a local address")
}

// rewriteTargets rewrites the targets of every static_configs entry of a scrape or
// alertmanager configuration, and returns the rows of the table it used.
func rewriteTargets(n *yaml.Node, t table) ([]Address, error) {
	var rows []Address
	for _, sc := range seq(mapValue(n, "static_configs")) {
		for _, target := range seq(mapValue(sc, "targets")) {
			row, err := t.row(target.Value)
			if err != nil {
				return nil, err
			}
			target.Value = row.Local(t.layout)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// splitSharedTarget adds metric relabelling to a job whose target a relay shares with
// another role (LayoutAll): a relay job keeps only the relay's metrics, the other job drops
// them, so that each series is stored once, under the job of the role that makes it.
func splitSharedTarget(job *yaml.Node, t table, rows []Address, relayRegex string) error {
	relays, shared := 0, false
	for _, row := range rows {
		shared = shared || t.sharedWithRelay(row.Local(t.layout))
		if row.Relay {
			relays++
		}
	}
	if !shared {
		return nil
	}
	if relays != 0 && relays != len(rows) {
		return errors.New("scrapes relays and other roles together: give the relays a job of their own")
	}
	if mapValue(job, "metric_relabel_configs") != nil {
		return errors.New("has metric_relabel_configs already: merge them by hand")
	}
	action, comment := "drop", "make run: this process runs the relay too; the relay's metrics are stored under the relay job."
	if relays > 0 {
		action, comment = "keep", "make run: the relay runs inside the API process; only the relay's metrics are stored under this job."
	}
	var rc yaml.Node
	if err := rc.Encode([]relabelConfig{{SourceLabels: []string{"__name__"}, Regex: relayRegex, Action: action}}); err != nil {
		return err
	}
	key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "metric_relabel_configs", HeadComment: comment}
	job.Content = append(job.Content, key, &rc)
	return nil
}

// relabelConfig is one entry of metric_relabel_configs, its keys in the order of the
// Prometheus documentation.
type relabelConfig struct {
	SourceLabels []string `yaml:"source_labels,flow"`
	Regex        string   `yaml:"regex"`
	Action       string   `yaml:"action"`
}

// relayMetricsRegex matches the series of the metrics an outbox relay process registers and
// an API process does not: those of pkg/outbox/outboxmetrics.NewRelay and
// pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics.NewPublisher, read from a registry of their own, so
// that a metric added there is split correctly without a change here. A family matches with
// the suffixes of its exposition (_bucket, _sum, _count of a histogram, _created).
func relayMetricsRegex() (string, error) {
	reg := prometheus.NewRegistry()
	if _, err := outboxmetrics.NewRelay(reg, nil); err != nil {
		return "", fmt.Errorf("relay metrics: %w", err)
	}
	if _, err := outboxrabbitmqmetrics.NewPublisher(reg, nil); err != nil {
		return "", fmt.Errorf("publisher metrics: %w", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return "", fmt.Errorf("relay metrics: %w", err)
	}
	var stems []string
	for _, mf := range mfs {
		stems = append(stems, regexp.QuoteMeta(strings.TrimSuffix(mf.GetName(), "_total")))
	}
	if len(stems) == 0 {
		return "", errors.New("relay metrics: none registered")
	}
	slices.Sort(stems)
	return "(" + strings.Join(stems, "|") + ")(_total|_created|_bucket|_sum|_count)?", nil
}

// copyRuleFiles copies the rule files the configuration names (rule_files, relative to it)
// to the same place relative to the generated one, after removing the copies of an earlier
// run, so that a rule file deleted from the repository is not loaded any more. With
// o.MaxFor, the copies have their alerts' for: cut (capFor).
func copyRuleFiles(o Options, root *yaml.Node) error {
	srcDir := filepath.Dir(filepath.Join(o.Deploy, sourcePrometheus))
	dstDir := filepath.Dir(filepath.Join(o.Dir, PrometheusConfig))
	patterns := seq(mapValue(root, "rule_files"))
	if len(patterns) == 0 {
		return fmt.Errorf("%s: no rule_files", sourcePrometheus)
	}
	for _, p := range patterns {
		if filepath.IsAbs(p.Value) || !filepath.IsLocal(filepath.Dir(p.Value)) {
			return fmt.Errorf("rule_files: %s is not a path inside %s", p.Value, srcDir)
		}
		if err := os.RemoveAll(filepath.Join(dstDir, filepath.Dir(p.Value))); err != nil {
			return err
		}
	}
	for _, p := range patterns {
		files, err := filepath.Glob(filepath.Join(srcDir, p.Value))
		if err != nil {
			return fmt.Errorf("rule_files %s: %w", p.Value, err)
		}
		if len(files) == 0 {
			return fmt.Errorf("rule_files %s: no file in %s", p.Value, srcDir)
		}
		for _, f := range files {
			rel, err := filepath.Rel(srcDir, f)
			if err != nil {
				return err
			}
			raw, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			if o.MaxFor > 0 {
				if raw, err = capFor(raw, o.MaxFor); err != nil {
					return fmt.Errorf("rule file %s: %w", f, err)
				}
			}
			dst := filepath.Join(dstDir, rel)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(dst, raw, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// capFor returns a rule file with every alert's for: longer than maxFor set to maxFor, and
// nothing else changed: it edits the values in the YAML tree, so comments and key order
// survive, and only the for: key of a rule counts (a label named for is a label). A file with
// no for: to cut is returned as it is; one with is written anew, which keeps the sources'
// two-space indentation and drops their blank lines.
func capFor(raw []byte, maxFor time.Duration) ([]byte, error) {
	doc, root, err := parseYAML(raw)
	if err != nil {
		return nil, err
	}
	changed := false
	for _, group := range seq(mapValue(root, "groups")) {
		for _, rule := range seq(mapValue(group, "rules")) {
			v := mapValue(rule, "for")
			if v == nil {
				continue
			}
			d, err := model.ParseDuration(v.Value)
			if err != nil {
				return nil, fmt.Errorf("line %d: for: %w", v.Line, err)
			}
			if time.Duration(d) > maxFor {
				v.Value = model.Duration(maxFor).String()
				changed = true
			}
		}
	}
	if !changed {
		return raw, nil
	}
	return encodeYAML(doc)
}

func generateAlertmanager(o Options, t table) error {
	src := filepath.Join(o.Deploy, sourceAlertmanager)
	doc, root, err := readYAML(src)
	if err != nil {
		return err
	}
	receivers := seq(mapValue(root, "receivers"))
	if len(receivers) == 0 {
		return fmt.Errorf("%s: no receivers", src)
	}
	for _, r := range receivers {
		for _, wh := range seq(mapValue(r, "webhook_configs")) {
			n := mapValue(wh, "url")
			if n == nil {
				continue
			}
			u, err := url.Parse(n.Value)
			if err != nil {
				return fmt.Errorf("%s: receiver %s: %w", src, scalar(mapValue(r, "name")), err)
			}
			row, err := t.row(u.Host)
			if err != nil {
				return fmt.Errorf("%s: receiver %s: %w", src, scalar(mapValue(r, "name")), err)
			}
			u.Host = row.Local(t.layout)
			n.Value = u.String()
		}
	}
	doc.HeadComment = header(sourceAlertmanager, t.layout) + "\n#\n# Notifications go to the alert logger that make observe runs, which prints them."
	if len(root.Content) > 0 {
		root.Content[0].HeadComment = ""
	}
	return writeYAML(filepath.Join(o.Dir, AlertmanagerConfig), doc)
}

func header(source string, layout Layout) string {
	how := "make run: one process per service"
	if layout == LayoutRoles {
		how = "one process per role"
	}
	return fmt.Sprintf("# Generated by make observe (deploy/observe) from deploy/%s for the shop on this machine\n"+
		"# (layout %s, %s). Do not edit: edit the source and run make observe again.", source, layout, how)
}

// readYAML returns the document node of a file and its top-level mapping.
func readYAML(path string) (doc, root *yaml.Node, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if doc, root, err = parseYAML(raw); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, root, nil
}

// parseYAML returns the document node of a YAML document and its top-level mapping.
func parseYAML(raw []byte) (doc, root *yaml.Node, err error) {
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		return nil, nil, err
	}
	if n.Kind != yaml.DocumentNode || len(n.Content) != 1 || n.Content[0].Kind != yaml.MappingNode {
		return nil, nil, errors.New("not a YAML mapping")
	}
	return &n, n.Content[0], nil
}

func writeYAML(path string, doc *yaml.Node) error {
	raw, err := encodeYAML(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// encodeYAML writes a document node indented by two spaces, as the sources are.
func encodeYAML(doc *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// mapValue is the value of key in a mapping node, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// seq is the items of a sequence node; nil for anything else.
func seq(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func scalar(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

// deleteKey removes key and its value from a mapping node, if there.
func deleteKey(n *yaml.Node, key string) {
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content = slices.Delete(n.Content, i, i+2)
			return
		}
	}
}

// setScalar sets key of a mapping node, adding it when missing.
func setScalar(n *yaml.Node, key, value string) {
	if v := mapValue(n, key); v != nil {
		v.Kind, v.Tag, v.Value, v.Content = yaml.ScalarNode, "!!str", value, nil
		return
	}
	n.Content = append(n.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}

// Package metricstest checks what a service serves on /metrics against the metric contract,
// docs/metrics.md, for the services' tests:
//
//	contract := metricstest.LoadContract(t).For("orders")
//	body, families := metricstest.Scrape(t, a.URL()+"/metrics")
//	metricstest.Check(t, contract, families, "orders") // every family, no other, service label
//	metricstest.Lint(t, families)                      // testutil.GatherAndLint
//	metricstest.Promtool(t, body)                      // promtool check metrics
package metricstest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ContractPath is where the contract lives, from the repository's root.
const ContractPath = "docs/metrics.md"

// Services are the services of the contract: a family named after one of them (orders_…,
// warehouse_…) is that service's own.
var Services = []string{"orders", "warehouse"}

// ServiceLabel is the constant label every family of a service carries, except those of the
// Go and process collectors.
const ServiceLabel = "service"

// Contract is the metric families docs/metrics.md lists.
type Contract struct {
	// Names are the families named in full.
	Names []string
	// Prefixes are the families listed by a wildcard, such as go_* ("go_"): at least one
	// family must match each.
	Prefixes []string
}

var (
	backticked = regexp.MustCompile("`([^`]*)`")
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
)

// LoadContract reads the contract from docs/metrics.md, found by walking up from the
// working directory. It fails t when the file lists suspiciously few families (the table
// layout changed and the parser no longer understands it).
func LoadContract(t testing.TB) Contract {
	t.Helper()
	path := findUp(t, ContractPath)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the metric contract: %v", err)
	}
	c := ParseContract(data)
	if len(c.Names) < 30 || !slices.Contains(c.Names, "http_requests_total") || !slices.Contains(c.Names, "outbox_published_total") {
		t.Fatalf("%s: parsed only %d families (%v): has its table layout changed?", path, len(c.Names), c.Names)
	}
	return c
}

// ParseContract reads the families out of the tables of docs/metrics.md: the backticked
// names in the first cell of each row. A wildcard (pgxpool_*) stands for the names of the
// row that match it, or, when the row names none (go_*), for any family with its prefix. The
// RabbitMQ section, the broker's own metrics, is left out.
func ParseContract(markdown []byte) Contract {
	var c Contract
	skip := false
	sc := bufio.NewScanner(bytes.NewReader(markdown))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			skip = strings.Contains(line, "RabbitMQ")
			continue
		}
		if skip || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			name := m[1]
			if prefix, ok := strings.CutSuffix(name, "*"); ok {
				var expanded []string
				for _, m := range backticked.FindAllStringSubmatch(line, -1) {
					if n := m[1]; strings.HasPrefix(n, prefix) && metricName.MatchString(n) {
						expanded = append(expanded, n)
					}
				}
				if len(expanded) == 0 {
					c.Prefixes = append(c.Prefixes, prefix)
				}
				c.Names = append(c.Names, expanded...)
				continue
			}
			if metricName.MatchString(name) {
				c.Names = append(c.Names, name)
			}
		}
	}
	slices.Sort(c.Names)
	c.Names = slices.Compact(c.Names)
	return c
}

// NotExported are the library families of the contract that no service exports, each with
// the reason: the libraries' own tests read them.
var NotExported = map[string]string{
	"outbox_partitions_ahead_seconds":                 "only a partitioned outbox table has it, and the services' are plain",
	"inbox_partitions_ahead_seconds":                  "only a partitioned inbox table has it, and the services' are plain",
	"inbox_partitions_last_success_timestamp_seconds": "the same",
}

// For returns the part of c that service exports: all but the other services' own families,
// and those of NotExported.
func (c Contract) For(service string) Contract {
	out := Contract{Prefixes: slices.Clone(c.Prefixes)}
	for _, n := range c.Names {
		_, other := NotExported[n]
		for _, s := range Services {
			if s != service && strings.HasPrefix(n, s+"_") {
				other = true
			}
		}
		if !other {
			out.Names = append(out.Names, n)
		}
	}
	return out
}

func (c Contract) byPrefix(name string) bool {
	for _, p := range c.Prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Families are parsed metric families by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url, a /metrics endpoint, in the text format, and returns the body and its
// families.
func Scrape(t testing.TB, url string) (string, Families) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s\n%s", url, res.Status, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: parse the exposition: %v\n%s", url, err, body)
	}
	return string(body), fams
}

// Check fails t for every family of c that fams lacks, every family of fams that c does not
// list, and every sample without service="service" (the Go and process collectors' families,
// c's Prefixes, are left as they are).
func Check(t testing.TB, c Contract, fams Families, service string) {
	t.Helper()
	for _, n := range c.Names {
		if _, ok := fams[n]; !ok {
			t.Errorf("%s is listed in %s but not exported", n, ContractPath)
		}
	}
	for _, p := range c.Prefixes {
		found := false
		for n := range fams {
			found = found || strings.HasPrefix(n, p)
		}
		if !found {
			t.Errorf("no %s* family is exported", p)
		}
	}
	for _, n := range sortedNames(fams) {
		if c.byPrefix(n) {
			continue
		}
		if !slices.Contains(c.Names, n) {
			t.Errorf("%s is exported but not listed in %s", n, ContractPath)
		}
		for _, m := range fams[n].GetMetric() {
			if v, ok := labelValue(m, ServiceLabel); !ok || v != service {
				t.Errorf("%s{%s} lacks %s=%q", n, labelString(m), ServiceLabel, service)
			}
		}
	}
}

// Lint runs fams through testutil.GatherAndLint and fails t for every problem.
func Lint(t testing.TB, fams Families) {
	t.Helper()
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		out := make([]*dto.MetricFamily, 0, len(fams))
		for _, n := range sortedNames(fams) {
			out = append(out, fams[n])
		}
		return out, nil
	})
	problems, err := testutil.GatherAndLint(g)
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// Promtool runs `promtool check metrics` on body and fails t when it reports a problem. When
// promtool is not on PATH it logs so and returns, except under CI=true, where that fails t.
func Promtool(t testing.TB, body string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool is not on PATH (%v); CI=true requires it", err)
		}
		t.Logf("promtool is not on PATH: skipping `promtool check metrics`")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
			return
		}
		t.Fatalf("run promtool: %v", err)
	}
}

// LabelValues returns the values label takes in family name, sorted.
func LabelValues(fams Families, name, label string) []string {
	var out []string
	for _, m := range fams[name].GetMetric() {
		if v, ok := labelValue(m, label); ok && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// Value returns the value of the sample of family name whose labels include labels (the
// sum, for a counter or gauge, over every sample that matches), and whether one matched.
// For a histogram it is the sample count.
func Value(fams Families, name string, labels map[string]string) (float64, bool) {
	var sum float64
	found := false
	for _, m := range fams[name].GetMetric() {
		match := true
		for k, want := range labels {
			if v, ok := labelValue(m, k); !ok || v != want {
				match = false
			}
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, found
}

// HTTPRequests gathers g and returns http_requests_total by "route method code", and the
// sample counts of http_request_duration_seconds by "route method". Every metric must carry
// service as its service label.
func HTTPRequests(t testing.TB, g prometheus.Gatherer, service string) (map[string]float64, map[string]uint64) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	counts, durations := map[string]float64{}, map[string]uint64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["service"] != service {
				t.Fatalf("%s{%s}: service label %q, want %q", f.GetName(), labelString(m), l["service"], service)
			}
			switch f.GetName() {
			case "http_requests_total":
				counts[l["route"]+" "+l["method"]+" "+l["code"]] = m.GetCounter().GetValue()
			case "http_request_duration_seconds":
				durations[l["route"]+" "+l["method"]] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return counts, durations
}

func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

func labelString(m *dto.Metric) string {
	parts := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

func sortedNames(fams Families) []string { return slices.Sorted(maps.Keys(fams)) }

// findUp looks for rel in the working directory and each of its parents.
func findUp(t testing.TB, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("find %s: %v", rel, err)
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("find %s: not in the working directory or any parent", rel)
		}
		dir = parent
	}
}

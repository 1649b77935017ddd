package deploy

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// severities are the values of the severity label; alertmanager.yml routes on them.
var severities = []string{"page", "ticket", "info"}

// recordName is the level:metric:operations convention of recording rule names.
var recordName = regexp.MustCompile(`^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$`)

func TestRules(t *testing.T) {
	t.Parallel()

	anchors := runbookAnchors(t)

	for _, r := range alertRules(t) {
		t.Run(fmt.Sprintf("alert %s %s", r.Alert, r.Labels["severity"]), func(t *testing.T) {
			t.Parallel()
			require.Positive(t, r.For, "for: is required, so that one bad scrape does not notify")
			require.Contains(t, severities, r.Labels["severity"], "severity label")
			for _, a := range []string{"summary", "description", "runbook_url"} {
				require.NotEmpty(t, r.Annotations[a], "annotation %s", a)
			}
			anchor := strings.ToLower(r.Alert)
			require.Equal(t, runbookURL+"#"+anchor, r.Annotations["runbook_url"])
			require.Contains(t, anchors, anchor, "%s has no ## %s heading", runbookDoc, r.Alert)
		})
	}

	for _, f := range loadRules(t) {
		for _, g := range f.groups {
			for _, r := range g.Rules {
				if r.Record == "" {
					continue
				}
				t.Run("record "+r.Record, func(t *testing.T) {
					t.Parallel()
					require.Regexp(t, recordName, r.Record, "recording rules are named level:metric:operations")
				})
			}
		}
	}
}

// ruleTestFile is the part of a promtool rule test file these checks read.
type ruleTestFile struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name           string `yaml:"name"`
		AlertRuleTests []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `yaml:"exp_labels"`
				ExpAnnotations map[string]string `yaml:"exp_annotations"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertsAreUnitTested checks that prometheus/tests shows every alerting rule firing
// (with its labels and all its annotations) and every alert not firing. promtool runs the
// tests themselves (TestPromtool).
func TestAlertsAreUnitTested(t *testing.T) {
	t.Parallel()

	type expectation struct {
		labels, annotations map[string]string
	}
	firing := map[string][]expectation{}
	quiet := map[string]bool{}
	for _, path := range glob(t, ruleTestsGlob) {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var f ruleTestFile
		require.NoError(t, yaml.Unmarshal(raw, &f), path)
		require.NotEmpty(t, f.RuleFiles, "%s lists no rule_files", path)
		for _, tc := range f.Tests {
			require.NotEmpty(t, tc.Name, "%s: every test has a name", path)
			for _, at := range tc.AlertRuleTests {
				if len(at.ExpAlerts) == 0 {
					quiet[at.Alertname] = true
				}
				for _, exp := range at.ExpAlerts {
					firing[at.Alertname] = append(firing[at.Alertname], expectation{exp.ExpLabels, exp.ExpAnnotations})
				}
			}
		}
	}

	for _, r := range alertRules(t) {
		t.Run(fmt.Sprintf("%s %v", r.Alert, r.Labels), func(t *testing.T) {
			t.Parallel()
			require.True(t, quiet[r.Alert], "no test expects %s not to fire", r.Alert)
			require.True(t, testedFiring(r, firing[r.Alert], func(e expectation) (map[string]string, map[string]string) {
				return e.labels, e.annotations
			}), "no test expects %s with labels %v to fire, with summary, description and runbook_url", r.Alert, r.Labels)
		})
	}
}

// testedFiring reports whether one of the expected alerts carries the rule's labels and all
// three annotations, the runbook_url unchanged.
func testedFiring[E any](r rulefmt.Rule, exps []E, split func(E) (map[string]string, map[string]string)) bool {
	for _, e := range exps {
		labels, annotations := split(e)
		if containsAll(labels, r.Labels) &&
			annotations["summary"] != "" && annotations["description"] != "" &&
			annotations["runbook_url"] == r.Annotations["runbook_url"] {
			return true
		}
	}
	return false
}

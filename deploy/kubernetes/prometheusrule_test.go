package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	yamlv3 "go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "write monitoring/prometheusrule.yaml from deploy/prometheus/rules")

const prometheusRuleFile = "monitoring/prometheusrule.yaml"

const prometheusRuleHeader = `# The alert and recording rules of deploy/prometheus/rules/*.yml (the compose stack's, tested
# with promtool there), for the Prometheus Operator. Generated, do not edit: change the rules
# there and run, in deploy/kubernetes,
#
#   go test -run TestPrometheusRule -update
#
# TestPrometheusRule fails while this file and the rules differ.
`

// rulesAsPrometheusRule reads deploy/prometheus/rules/*.yml, each decoded strictly into the
// Prometheus Operator's rule groups, into one PrometheusRule.
func rulesAsPrometheusRule(t *testing.T) monitoringv1.PrometheusRule {
	t.Helper()
	files, err := filepath.Glob(repoPath("deploy", "prometheus", "rules", "*.yml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	pr := monitoringv1.PrometheusRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "monitoring.coreos.com/v1", Kind: "PrometheusRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "outboxshop"},
	}
	for _, f := range files { // Glob sorts them
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var spec monitoringv1.PrometheusRuleSpec
		require.NoError(t, yaml.UnmarshalStrict(b, &spec), "%s as PrometheusRule groups", f)
		require.NotEmpty(t, spec.Groups, f)
		pr.Spec.Groups = append(pr.Spec.Groups, spec.Groups...)
	}
	return pr
}

// marshalPrometheusRule renders pr as YAML with block scalars for the multi-line expressions.
func marshalPrometheusRule(t *testing.T, pr monitoringv1.PrometheusRule) []byte {
	t.Helper()
	j, err := json.Marshal(pr)
	require.NoError(t, err)
	var node yamlv3.Node
	require.NoError(t, yamlv3.Unmarshal(j, &node))
	var style func(n *yamlv3.Node)
	style = func(n *yamlv3.Node) {
		n.Style &^= yamlv3.FlowStyle
		if n.Kind == yamlv3.ScalarNode && n.Tag == "!!str" {
			n.Style = 0
			if bytes.ContainsRune([]byte(n.Value), '\n') {
				n.Style = yamlv3.LiteralStyle
			}
		}
		for _, c := range n.Content {
			style(c)
		}
	}
	style(&node)
	var buf bytes.Buffer
	buf.WriteString(prometheusRuleHeader)
	enc := yamlv3.NewEncoder(&buf)
	enc.SetIndent(2)
	require.NoError(t, enc.Encode(&node))
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

func TestPrometheusRule(t *testing.T) {
	t.Parallel()
	want := rulesAsPrometheusRule(t)
	if *update {
		require.NoError(t, os.WriteFile(prometheusRuleFile, marshalPrometheusRule(t, want), 0o644))
	}

	t.Run("the file holds exactly the rules of deploy/prometheus/rules", func(t *testing.T) {
		b, err := os.ReadFile(prometheusRuleFile)
		require.NoError(t, err)
		var got monitoringv1.PrometheusRule
		require.NoError(t, yaml.UnmarshalStrict(b, &got))
		require.Equal(t, want, got, "run `go test -run TestPrometheusRule -update` in deploy/kubernetes")
		require.Equal(t, string(marshalPrometheusRule(t, want)), string(b), "the file is as generated")
	})

	t.Run("the build has it as it is", func(t *testing.T) {
		prs := all[monitoringv1.PrometheusRule](t)
		require.Len(t, prs, 1)
		require.Equal(t, want.Spec, prs[0].Spec)
	})
}

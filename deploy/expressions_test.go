package deploy

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExpressions parses every expression of the rules and the dashboards and checks that
// each metric it selects exists.
func TestExpressions(t *testing.T) {
	t.Parallel()

	known, err := knownMetrics()
	require.NoError(t, err)
	known = maps.Clone(known)
	for _, f := range loadRules(t) {
		for _, g := range f.groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					known[r.Record] = "recording rule in " + f.path
				}
			}
		}
	}

	check := func(t *testing.T, expr string) {
		t.Helper()
		parsed, err := promql.ParseExpr(expr)
		require.NoError(t, err, "expression:\n%s", expr)
		names, err := metricNames(parsed)
		require.NoError(t, err, "expression:\n%s", expr)
		for _, name := range names {
			_, ok := known[name]
			require.True(t, ok, "metric %q is exported by nothing known: not a recording rule, not in "+
				"pkg/outbox/outboxmetrics or pkg/inbox/inboxmetrics, not in the Services table of %s, not in %s, "+
				"not a Go or process collector metric\nexpression:\n%s", name, metricsDoc, rabbitmqFixture, expr)
		}
	}

	t.Run("rules", func(t *testing.T) {
		t.Parallel()
		for _, f := range loadRules(t) {
			for _, g := range f.groups {
				for i, r := range g.Rules {
					t.Run(fmt.Sprintf("%s/%s/%d-%s", filepath.Base(f.path), g.Name, i, r.Record+r.Alert), func(t *testing.T) {
						t.Parallel()
						check(t, r.Expr)
					})
				}
			}
		}
	})

	t.Run("dashboards", func(t *testing.T) {
		t.Parallel()
		for _, d := range loadDashboards(t) {
			queries := d.queries()
			require.NotEmpty(t, queries, "%s has no query", d.path)
			for _, q := range queries {
				t.Run(filepath.Base(d.path)+"/"+q.where, func(t *testing.T) {
					t.Parallel()
					check(t, substituteGrafanaVariables(q.expr))
				})
			}
		}
	})
}

func TestSubstituteGrafanaVariables(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ in, want string }{
		{`rate(x{job=~"$service.*"}[$__rate_interval])`, `rate(x{job=~".*.*"}[1m])`},
		{`increase(x[${__rate_interval}])`, `increase(x[1m])`},
		{`max_over_time(x[$__range]) + avg_over_time(x[$__interval])`, `max_over_time(x[1h]) + avg_over_time(x[1m])`},
		{`x{instance=~"${instance:regex}",job=~"[[job]]"}`, `x{instance=~".*",job=~".*"}`},
		{`x{ds="$datasource${datasource}"}`, `x{ds=""}`},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, substituteGrafanaVariables(tt.in))
		})
	}
}

func TestMetricNames(t *testing.T) {
	t.Parallel()

	t.Run("selectors, including inside functions and binary operations", func(t *testing.T) {
		t.Parallel()
		expr, err := promql.ParseExpr(`sum(rate(a_total[5m])) / on() group_left b{job="x"} or {__name__="c"}`)
		require.NoError(t, err)
		names, err := metricNames(expr)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"a_total", "b", "c"}, names)
	})

	t.Run("a selector without a fixed name is an error", func(t *testing.T) {
		t.Parallel()
		expr, err := promql.ParseExpr(`{__name__=~"outbox_.*"}`)
		require.NoError(t, err)
		_, err = metricNames(expr)
		require.ErrorContains(t, err, "no fixed metric name")
	})
}

// TestMetricsDoc checks that docs/metrics.md and the libraries' registries name the same
// metrics, and that the families it leaves to the Go collectors exist.
func TestMetricsDoc(t *testing.T) {
	t.Parallel()

	doc, err := parseMetricsDoc(metricsDoc)
	require.NoError(t, err)

	t.Run("pkg sections list what pkg/outbox/outboxmetrics and pkg/inbox/inboxmetrics register", func(t *testing.T) {
		t.Parallel()
		outboxNames, err := outboxMetricNames()
		require.NoError(t, err)
		inboxNames, err := inboxMetricNames()
		require.NoError(t, err)
		require.ElementsMatch(t, doc.library, append(outboxNames, inboxNames...))
	})

	t.Run("Services section", func(t *testing.T) {
		t.Parallel()
		for _, want := range []string{"http_requests_total", "http_request_duration_seconds_bucket",
			"warehouse_stock_available", "pgxpool_acquired_conns"} {
			require.Contains(t, doc.services, want)
		}
		require.ElementsMatch(t, []string{"go_", "process_"}, doc.wildcards)
	})

	t.Run("wildcard families come from the Go and process collectors", func(t *testing.T) {
		t.Parallel()
		known, err := knownMetrics()
		require.NoError(t, err)
		for _, prefix := range doc.wildcards {
			found := false
			for name, source := range known {
				if strings.HasPrefix(name, prefix) && source == "Go and process collectors" {
					found = true
					break
				}
			}
			require.True(t, found, "no %s* metric from the Go and process collectors", prefix)
		}
	})

	t.Run("RabbitMQ fixture has the per-queue and unroutable series", func(t *testing.T) {
		t.Parallel()
		names, err := rabbitmqMetricNames(rabbitmqFixture)
		require.NoError(t, err)
		for _, want := range []string{
			"rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
			"rabbitmq_detailed_queue_messages", "rabbitmq_detailed_queue_consumers",
			"rabbitmq_channel_messages_unroutable_returned_total", "rabbitmq_channel_messages_unroutable_dropped_total",
			"rabbitmq_global_messages_unroutable_returned_total", "rabbitmq_global_messages_unroutable_dropped_total",
		} {
			require.Contains(t, names, want)
		}
	})
}

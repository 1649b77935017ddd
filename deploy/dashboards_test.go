package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// datasourceRef is how every panel and query names its datasource: through the dashboard's
// one datasource variable, so that the dashboards import into any Grafana.
var datasourceRef = map[string]any{"type": "prometheus", "uid": "${datasource}"}

// rateIntervalSentinel replaces $__rate_interval when checking ranges: no dashboard writes
// this duration by hand, so a range equal to it came from the variable.
const rateIntervalSentinel = 7777 * time.Second

func TestDashboards(t *testing.T) {
	t.Parallel()

	// File name, uid and title of every dashboard: the uids are stable, links and the
	// compose home dashboard (outbox-inbox) depend on them.
	want := map[string]string{
		"outbox-inbox.json": "Outbox & Inbox",
		"shop.json":         "Shop",
		"rabbitmq.json":     "RabbitMQ",
	}
	dashboards := loadDashboards(t)
	var files []string
	for _, d := range dashboards {
		files = append(files, filepath.Base(d.path))
	}
	require.ElementsMatch(t, sortedKeys(want), files)

	for _, d := range dashboards {
		file := filepath.Base(d.path)
		t.Run(file, func(t *testing.T) {
			t.Parallel()

			t.Run("identity", func(t *testing.T) {
				t.Parallel()
				require.Equal(t, strings.TrimSuffix(file, ".json"), d.json["uid"], "uid must be the file name")
				require.Equal(t, want[file], d.json["title"])
				id, ok := d.json["id"]
				require.True(t, ok, `"id" must be present and null`)
				require.Nil(t, id, `"id" must be null, Grafana assigns it`)
				version, _ := d.json["schemaVersion"].(float64)
				require.GreaterOrEqual(t, version, 39.0, "schemaVersion")
			})

			t.Run("no import placeholders", func(t *testing.T) {
				t.Parallel()
				require.NotContains(t, d.json, "__inputs", "exported-for-sharing dashboards do not provision")
				require.NotContains(t, d.json, "__requires")
				require.False(t, bytes.Contains(d.raw, []byte("${DS_")), "${DS_…} placeholder")
			})

			t.Run("one datasource variable", func(t *testing.T) {
				t.Parallel()
				var dsVars []map[string]any
				for _, v := range d.variables() {
					if v["type"] == "datasource" {
						dsVars = append(dsVars, v)
						continue
					}
					if ds, ok := v["datasource"]; ok && ds != nil {
						require.Equal(t, datasourceRef, ds, "variable %v", v["name"])
					}
				}
				require.Len(t, dsVars, 1)
				require.Equal(t, "datasource", dsVars[0]["name"])
				require.Equal(t, "prometheus", dsVars[0]["query"])
			})

			t.Run("every panel and query uses the datasource variable", func(t *testing.T) {
				t.Parallel()
				ids := map[float64]string{}
				for _, p := range d.panels() {
					title := fmt.Sprint(p["title"])
					id, ok := p["id"].(float64)
					require.True(t, ok, "panel %q has no id", title)
					require.NotContains(t, ids, id, "panel %q reuses the id of %q", title, ids[id])
					ids[id] = title
					if p["type"] == "row" {
						continue
					}
					require.Equal(t, datasourceRef, p["datasource"], "panel %q", title)
					targets, _ := p["targets"].([]any)
					require.NotEmpty(t, targets, "panel %q has no query", title)
					for _, tg := range targets {
						target, _ := tg.(map[string]any)
						require.Equal(t, datasourceRef, target["datasource"], "panel %q target %v", title, target["refId"])
						require.NotEmpty(t, target["expr"], "panel %q target %v", title, target["refId"])
					}
				}
				for _, a := range d.annotations() {
					if a["builtIn"] == 1.0 {
						continue
					}
					require.Equal(t, datasourceRef, a["datasource"], "annotation %v", a["name"])
				}
			})

			t.Run("rate and increase use $__rate_interval", func(t *testing.T) {
				t.Parallel()
				for _, q := range d.queries() {
					require.NoError(t, checkRateIntervals(q.expr), q.where)
				}
			})

			t.Run("firing alerts are shown", func(t *testing.T) {
				t.Parallel()
				shown := false
				for _, p := range d.panels() {
					shown = shown || p["type"] == "alertlist"
				}
				for _, a := range d.annotations() {
					expr, _ := a["expr"].(string)
					shown = shown || (a["enable"] == true && strings.Contains(expr, "ALERTS{"))
				}
				require.True(t, shown, "no alertlist panel and no annotation of the ALERTS series")
			})
		})
	}
}

// checkRateIntervals reports every rate(), irate() or increase() of a dashboard expression
// whose range is not $__rate_interval.
func checkRateIntervals(expr string) error {
	sentinel := fmt.Sprintf("%ds", int(rateIntervalSentinel.Seconds()))
	expr = strings.NewReplacer("${__rate_interval}", sentinel, "$__rate_interval", sentinel).Replace(expr)
	parsed, err := promql.ParseExpr(substituteGrafanaVariables(expr))
	if err != nil {
		return err
	}
	var errs []error
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		call, ok := node.(*parser.Call)
		if !ok || !slices.Contains([]string{"rate", "irate", "increase"}, call.Func.Name) {
			return nil
		}
		ms, ok := call.Args[0].(*parser.MatrixSelector)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: the argument is not a range selector", call))
		case ms.Range != rateIntervalSentinel:
			errs = append(errs, fmt.Errorf("%s: the range must be $__rate_interval", call))
		}
		return nil
	})
	return errors.Join(errs...)
}

func TestCheckRateIntervals(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		expr string
		ok   bool
	}{
		{`sum(rate(a_total[$__rate_interval]))`, true},
		{`increase(a_total{job=~"$service.*"}[${__rate_interval}])`, true},
		{`max_over_time(a[$__range])`, true},
		{`rate(a_total[5m])`, false},
		{`increase(a_total[$__range])`, false},
		{`rate(a_total[$__rate_interval]) / rate(b_total[1m])`, false},
	} {
		t.Run(tt.expr, func(t *testing.T) {
			t.Parallel()
			err := checkRateIntervals(tt.expr)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

// exemplarHistograms are the latency histograms whose observations carry the trace id of a
// sampled span as an exemplar (docs/metrics.md), by the dashboard whose panel plots them.
var exemplarHistograms = map[string]string{
	"outbox_commit_to_confirm_seconds": "outbox-inbox.json",
	"inbox_handler_duration_seconds":   "outbox-inbox.json",
	"http_request_duration_seconds":    "shop.json",
}

// TestDashboardExemplars: every query of a histogram that carries exemplars shows them, so
// that a slow point on the panel links to its trace (Grafana's Prometheus datasource turns
// the exemplar's trace_id into a link to the trace datasource), and each such histogram is
// plotted with them somewhere.
func TestDashboardExemplars(t *testing.T) {
	t.Parallel()
	shown := map[string]bool{}
	for _, d := range loadDashboards(t) {
		for _, p := range d.panels() {
			targets, _ := p["targets"].([]any)
			for _, tg := range targets {
				target, _ := tg.(map[string]any)
				expr, _ := target["expr"].(string)
				for metric, file := range exemplarHistograms {
					if !strings.Contains(expr, metric+"_bucket") {
						continue
					}
					require.Equal(t, true, target["exemplar"], "%s panel %q target %v: \"exemplar\": true", filepath.Base(d.path), p["title"], target["refId"])
					if filepath.Base(d.path) == file {
						shown[metric] = true
					}
				}
			}
		}
	}
	for metric, file := range exemplarHistograms {
		require.True(t, shown[metric], "%s plots no %s with exemplars", file, metric)
	}
}

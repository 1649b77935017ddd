package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	kit "github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// rareMetrics are the metric names the rules and dashboards select that this test cannot make
// exist, each with the reason. Keep it short: every other selected name must have series.
//
// The traffic below creates every other series. In particular a poison message makes the
// dead-letter series (inbox_dead_lettered_total has no series before the first dead letter),
// the relay's histograms have no labels (their buckets exist from the start), and RabbitMQ
// exports its unroutable and dead-lettered counters at zero.
var rareMetrics = map[string]string{
	"outbox_partitions_ahead_seconds": "only a partitioned outbox table has it, and the shop's are plain: " +
		"pkg/outbox/outboxmetrics' TestStatsPartitioned reads it from one, and promtool tests its rule",
	"inbox_partitions_ahead_seconds": "only a partitioned inbox table has it, and the shop's are plain: " +
		"pkg/inbox/inboxmetrics' TestPartitions reads it from one, and promtool tests its rule",
}

// alertMetrics are the series Prometheus writes for active alerts. They cannot exist before
// an alert is pending, so they are checked in the RelayStalled subtest, which raises one.
var alertMetrics = []string{"ALERTS", "ALERTS_FOR_STATE"}

// serviceJobs are the Prometheus jobs of the shop's own processes (docs/metrics.md).
var serviceJobs = []string{"orders-api", "orders-relay", "warehouse", "warehouse-relay"}

// exemplarSpans are the histograms whose observations carry the trace_id and span_id of a
// sampled span as an exemplar (docs/metrics.md), with the kind and name prefix of that span
// and the jobs that observe them in this test's traffic.
var exemplarSpans = map[string]struct {
	kind trace.SpanKind
	name string
	jobs []string
}{
	"outbox_commit_to_confirm_seconds": {trace.SpanKindProducer, "publish ", []string{"orders-relay", "warehouse-relay"}},
	"inbox_handler_duration_seconds":   {trace.SpanKindConsumer, "process ", []string{"orders-api", "warehouse"}},
	"http_request_duration_seconds":    {trace.SpanKindServer, "", []string{"orders-api", "warehouse"}},
}

// TestObservability proves deploy/'s monitoring on a real Prometheus scraping the running
// shop: the four processes of docs/metrics.md (each service's API and relay apart) and
// RabbitMQ's plugin, with deploy/prometheus/prometheus.yml's jobs and rules (alerts' for: cut
// to seconds). Prometheus accepts every expression of the rules and dashboards, every metric
// they select has series, every rule evaluates, promtool finds nothing wrong in the processes'
// /metrics, Prometheus stores the latency histograms' exemplars, whose trace and span ids
// are those of spans the shop exported, the WAL relay's panels draw the orders service, which
// streams its slot (ORDERS_RELAY_MODE=wal), and stopping the orders relay while orders keep
// coming raises OutboxRelayStalled for orders, which resolves once a relay drains the
// backlog.
func TestObservability(t *testing.T) {
	t.Parallel()
	prometheusBin := requireTool(t, "prometheus")
	promtool := requireTool(t, "promtool")
	mon := loadMonitoring(t)

	// Each service traces into memory, as cmd/ would export over OTLP (sampling every trace,
	// as the compose stack does), so that the exemplars can be matched with the spans.
	exported := tracetest.NewInMemoryExporter()
	provider := func(name string) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exported),
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(name))))
		t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) }) // after the shop stopped
		return tp
	}
	// The orders service runs on the WAL relay, on a server of its own at wal_level=logical
	// (the shared one stays at replica), so that the WAL relay's panels and alerts are proven
	// on a streaming relay; the warehouse polls.
	srv, stopServer, err := testinfra.StartServer("-c", "wal_level=logical", "-c", "max_slot_wal_keep_size=1GB")
	t.Cleanup(stopServer)
	require.NoError(t, err, "a private PostgreSQL server at wal_level=logical")
	ordersDB := createDatabase(t, srv.URL("postgres"), "orders")
	s := startSplitShop(t, ordersDB, ordersapp.Options{TracerProvider: provider("orders")},
		warehouseapp.Options{TracerProvider: provider("warehouse")})
	start := time.Now()
	rabbitmq := rabbitmqMetricsAddr(t, s.amqpURL)
	// Each compose address of the configuration, as this test runs it. No Alertmanager runs:
	// Prometheus's notifications to a port nobody listens on fail, which only its log says.
	promAddr := freeLocalAddr(t)
	configFile := localPrometheusConfig(t, map[string]string{
		"orders-api:8080":      s.ordersAPI.Addr(),
		"orders-relay:8081":    s.ordersRelay.OpsAddr(),
		"warehouse:8090":       s.warehouseAPI.HTTPAddr(),
		"warehouse-relay:8091": s.warehouseRelay.HTTPAddr(),
		"rabbitmq:15692":       rabbitmq,
		"prometheus:9090":      promAddr,
		"alertmanager:9093":    freeLocalAddr(t),
		"alert-logger:8080":    freeLocalAddr(t),
	})
	targets := map[string]string{
		"orders-api":        s.ordersAPI.Addr(),
		"orders-relay":      s.ordersRelay.OpsAddr(),
		"warehouse":         s.warehouseAPI.HTTPAddr(),
		"warehouse-relay":   s.warehouseRelay.HTTPAddr(),
		"rabbitmq":          rabbitmq,
		"rabbitmq-detailed": rabbitmq,
	}
	require.Equal(t, targets, scrapeTargets(t, configFile), "every job of %s scrapes its process of this test", deployPrometheusConfig)
	for _, f := range mon.ruleFiles {
		requireOnlyForCut(t, filepath.Join(filepath.Dir(configFile), f.rel), f.groups)
	}
	prom := startPrometheus(t, prometheusBin, configFile, promAddr)

	s.placeOrders(t, 40)
	s.deadLetterOne(t)

	waitFor(t, 30*time.Second, "every target up", func() (bool, string) {
		up := map[string]bool{}
		var status []string
		for _, tg := range prom.targets(t) {
			job := string(tg.Labels[model.JobLabel])
			up[job] = up[job] || tg.Health == promv1.HealthGood
			status = append(status, fmt.Sprintf("%s %s: %s %s", job, tg.ScrapeURL, tg.Health, tg.LastError))
		}
		for job := range targets {
			if !up[job] {
				return false, strings.Join(status, "\n")
			}
		}
		return true, ""
	})

	t.Run("SteadyState", func(t *testing.T) {
		t.Run("ExpressionsAccepted", func(t *testing.T) {
			t.Parallel()
			var accepted, uses int
			for _, e := range mon.exprs {
				uses += len(e.where)
				_, err := prom.query(t, e.expr)
				if assert.NoError(t, err, "Prometheus rejects the expression of %s:\n%s", strings.Join(e.where, "; "), e.expr) {
					accepted++
				}
			}
			t.Logf("Prometheus accepted %d of %d distinct expressions (%d uses in rules, panels and annotations)", accepted, len(mon.exprs), uses)
		})

		t.Run("SelectedMetricsExist", func(t *testing.T) {
			t.Parallel()
			uses := mon.metrics()
			missing := map[string]metricUse{}
			var skipped []string
			for _, u := range uses {
				if _, rare := rareMetrics[u.name]; rare || slices.Contains(alertMetrics, u.name) {
					skipped = append(skipped, u.name)
					continue
				}
				missing[u.name] = u
			}
			t.Logf("checking %d metric names; %d checked elsewhere or allowlisted: %v", len(missing), len(skipped), skipped)
			status, ok := poll(t, 30*time.Second, func() (bool, string) {
				for name := range missing {
					if prom.count(t, fmt.Sprintf("{__name__=%q}", name)) > 0 {
						delete(missing, name)
					}
				}
				var b strings.Builder
				for _, name := range slices.Sorted(maps.Keys(missing)) {
					u := missing[name]
					fmt.Fprintf(&b, "%s (selected as %s; used by %s)\n", name, strings.Join(u.selectors, ", "), abbreviate(u.where, 3))
				}
				return len(missing) == 0, b.String()
			})

			// For information, once the series exist: selectors whose matchers find nothing
			// although the name exists, and dashboard queries that draw nothing.
			var empty []string
			for _, u := range uses {
				if _, absent := missing[u.name]; absent || slices.Contains(skipped, u.name) {
					continue
				}
				for _, sel := range u.selectors {
					if prom.count(t, sel) == 0 {
						empty = append(empty, sel)
					}
				}
			}
			t.Logf("selectors that select nothing right now (for information):\n%s", strings.Join(empty, "\n"))
			empty = nil
			for _, e := range mon.exprs {
				if !strings.Contains(e.where[0], ".json ") || slices.ContainsFunc(vectorSelectors(e.parsed), func(vs *parser.VectorSelector) bool {
					return slices.Contains(alertMetrics, selectorName(vs))
				}) {
					continue
				}
				if v, err := prom.query(t, e.expr); err == nil {
					if vec, ok := v.(model.Vector); ok && len(vec) == 0 {
						empty = append(empty, fmt.Sprintf("%s: %s", abbreviate(e.where, 1), e.expr))
					}
				}
			}
			t.Logf("dashboard queries that draw nothing right now (for information):\n%s", strings.Join(empty, "\n"))
			require.True(t, ok, "%d metric names the rules and dashboards select have no series after 30s:\n%s", len(missing), status)
		})

		t.Run("RuleGroupsHealthy", func(t *testing.T) {
			t.Parallel()
			want := map[string]int{}
			for _, f := range mon.ruleFiles {
				for _, g := range f.groups {
					want[filepath.Base(f.rel)+" "+g.Name] = len(g.Rules)
				}
			}
			waitFor(t, 30*time.Second, "every rule evaluated with health ok", func() (bool, string) {
				got := map[string]int{}
				var problems []string
				for _, g := range prom.rules(t) {
					got[filepath.Base(g.File)+" "+g.Name] = len(g.Rules)
					for _, r := range g.Rules {
						var name, lastError string
						var health promv1.RuleHealth
						switch r := r.(type) {
						case promv1.AlertingRule:
							name, health, lastError = r.Name, r.Health, r.LastError
						case promv1.RecordingRule:
							name, health, lastError = r.Name, r.Health, r.LastError
						}
						if health != promv1.RuleHealthGood {
							problems = append(problems, fmt.Sprintf("group %s rule %s: health %q %s", g.Name, name, health, lastError))
						}
					}
				}
				if !assert.ObjectsAreEqual(want, got) {
					problems = append(problems, fmt.Sprintf("groups and rule counts: want %v, Prometheus has %v", want, got))
				}
				return len(problems) == 0, strings.Join(problems, "\n")
			})
			t.Logf("%d rule groups evaluated, every rule healthy", len(want))
		})

		t.Run("Exemplars", func(t *testing.T) {
			t.Parallel()
			// Prometheus asks for OpenMetrics, the format that carries exemplars, and keeps
			// them (--enable-feature=exemplar-storage); each names a span the shop exported, of
			// the kind the histogram measures. An exemplar's span may end after its
			// observation (a publish span ends once its batch's hooks ran): hence the poll.
			var found map[string]int
			waitFor(t, 60*time.Second, "exemplars of every latency histogram, from every job that observes it, naming exported spans", func() (bool, string) {
				ended := map[trace.SpanID]tracetest.SpanStub{}
				for _, sp := range exported.GetSpans() {
					ended[sp.SpanContext.SpanID()] = sp
				}
				found = map[string]int{}
				var problems []string
				for _, metric := range slices.Sorted(maps.Keys(exemplarSpans)) {
					want := exemplarSpans[metric]
					byJob := map[string]int{}
					for _, r := range prom.exemplars(t, fmt.Sprintf("{__name__=%q}", metric+"_bucket"), start) {
						job := string(r.SeriesLabels[model.JobLabel])
						for _, e := range r.Exemplars {
							traceID, spanID := string(e.Labels["trace_id"]), string(e.Labels["span_id"])
							sid, err := trace.SpanIDFromHex(spanID)
							if err != nil {
								problems = append(problems, fmt.Sprintf("%s{job=%q}: exemplar %s: span_id: %v", metric, job, e.Labels, err))
								continue
							}
							sp, ok := ended[sid]
							switch {
							case !ok:
								problems = append(problems, fmt.Sprintf("%s{job=%q}: exemplar %s names no exported span (yet)", metric, job, e.Labels))
							case sp.SpanContext.TraceID().String() != traceID:
								problems = append(problems, fmt.Sprintf("%s{job=%q}: exemplar %s: span %s is of trace %s", metric, job, e.Labels, spanID, sp.SpanContext.TraceID()))
							case sp.SpanKind != want.kind || !strings.HasPrefix(sp.Name, want.name):
								problems = append(problems, fmt.Sprintf("%s{job=%q}: exemplar %s names span %q of kind %s, want %s %q…", metric, job, e.Labels, sp.Name, sp.SpanKind, want.kind, want.name))
							default:
								byJob[job]++
								found[metric]++
							}
						}
					}
					for _, job := range want.jobs {
						if byJob[job] == 0 {
							problems = append(problems, fmt.Sprintf("%s: no exemplar from job %s", metric, job))
						}
					}
				}
				return len(problems) == 0, strings.Join(problems, "\n")
			})
			t.Logf("exemplars naming exported spans, by histogram: %v", found)
		})

		t.Run("WALRelayPanelsDrawData", func(t *testing.T) {
			t.Parallel()
			// Every query of the panels on the WAL relay draws the orders service, which
			// streams its slot. Catch-ups are drawn as their increase: the one this relay made
			// (its first slot, before Prometheus's first scrape) is read from the counter.
			var queries []expression
			for _, e := range mon.exprs {
				if slices.ContainsFunc(e.where, func(w string) bool {
					return strings.Contains(w, `panel "WAL relay slot"`) || strings.Contains(w, `panel "WAL relays"`)
				}) {
					queries = append(queries, e)
				}
			}
			require.Len(t, queries, 6, "the queries of the panels WAL relay slot and WAL relays")
			waitFor(t, 30*time.Second, "every WAL relay panel query draws the orders service", func() (bool, string) {
				var problems []string
				for _, e := range queries {
					if strings.Contains(e.expr, "outbox_wal_catchups_total") {
						e.expr = `outbox_wal_catchups_total{job="orders-relay",reason="new"} == 1`
					}
					v, err := prom.query(t, e.expr)
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s: %v", e.expr, err))
						continue
					}
					vec, _ := v.(model.Vector)
					if !slices.ContainsFunc(vec, func(s *model.Sample) bool { return strings.HasPrefix(string(s.Metric[model.JobLabel]), "orders") }) {
						problems = append(problems, fmt.Sprintf("%s: %v", e.expr, v))
					}
				}
				return len(problems) == 0, strings.Join(problems, "\n")
			})
			active, ok := prom.scalar(t, `max(outbox_wal_slot_active{job="orders-api"})`)
			require.True(t, ok && active == 1, "the orders slot is streamed")
		})

		t.Run("PromtoolCheckMetrics", func(t *testing.T) {
			t.Parallel()
			for _, job := range serviceJobs {
				t.Run(job, func(t *testing.T) {
					t.Parallel()
					body := scrape(t, "http://"+targets[job]+"/metrics")
					cmd := exec.CommandContext(t.Context(), promtool, "check", "metrics")
					cmd.Stdin = bytes.NewReader(body)
					out, err := cmd.CombinedOutput()
					require.NoError(t, err, "promtool check metrics on the /metrics of %s:\n%s", job, out)
					require.Empty(t, strings.TrimSpace(string(out)))
				})
			}
		})
	})

	t.Run("RelayStalled", func(t *testing.T) {
		stalledRules := mon.alertRule(t, "OutboxRelayStalled")
		mon.alertRule(t, "TargetDown")
		const backlog = `service:outbox_pending_messages:max{service="orders"}`
		const relayUp = `service:outbox_relay_up:max{service="orders"}`
		waitFor(t, 15*time.Second, "the orders backlog and relay are recorded (the alert's inputs)", func() (bool, string) {
			b, r := prom.count(t, backlog), prom.count(t, relayUp)
			if b > 0 && r > 0 {
				return true, ""
			}
			// What the rules read, and whether the orders scrapes are ingested: one that
			// Prometheus rolls back (see startPrometheus) reports up 0, and its sample
			// counts stop where ingestion failed.
			return false, strings.Join([]string{
				fmt.Sprintf("%s: %d series, %s: %d series", backlog, b, relayUp, r),
				prom.describe(t, `outbox_pending_messages{job=~"orders-.*"}`),
				prom.describe(t, `up{job=~"orders-.*"}`),
				prom.describe(t, `scrape_samples_scraped{job=~"orders-.*"}`),
				prom.describe(t, `scrape_samples_post_metric_relabeling{job=~"orders-.*"}`),
			}, "\n")
		})

		relayAddr := s.ordersRelay.OpsAddr()
		require.NoError(t, s.ordersRelay.Stop())
		ctx, stopOrdering := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		placed := 0
		wg.Go(func() { placed = s.keepOrdering(ctx, t) })
		stopped := false
		stop := func() {
			if !stopped {
				stopOrdering()
				wg.Wait()
				stopped = true
			}
		}
		defer stop()

		isStalledOrders := func(a promv1.Alert) bool {
			return a.Labels[model.AlertNameLabel] == "OutboxRelayStalled" &&
				a.Labels[model.JobLabel] == "orders-relay" && a.Labels["service"] == "orders"
		}
		waitFor(t, 60*time.Second, "OutboxRelayStalled (job orders-relay, service orders) firing and TargetDown for orders-relay", func() (bool, string) {
			var stalled, down bool
			var status []string
			for _, a := range prom.alerts(t) {
				status = append(status, fmt.Sprintf("%s %s", a.State, a.Labels))
				switch {
				case isStalledOrders(a):
					stalled = a.State == promv1.AlertStateFiring && slices.ContainsFunc(stalledRules, func(r rulefmt.Rule) bool {
						return hasLabels(a.Labels, r.Labels)
					})
				case a.Labels[model.AlertNameLabel] == "TargetDown" && a.Labels[model.JobLabel] == "orders-relay":
					down = true
				}
			}
			b, _ := prom.scalar(t, backlog)
			r, _ := prom.scalar(t, relayUp)
			status = append(status, fmt.Sprintf("%s = %v, %s = %v", backlog, b, relayUp, r))
			return stalled && down, strings.Join(status, "\n")
		})
		for _, a := range prom.alerts(t) {
			require.False(t, a.Labels[model.AlertNameLabel] == "OutboxRelayStalled" && a.Labels["service"] != "orders",
				"only the orders relay is stopped, yet: %s", a.Labels)
		}
		require.Positive(t, prom.count(t, `ALERTS{alertname="OutboxRelayStalled",alertstate="firing",job="orders-relay",service="orders"}`),
			"the dashboards' Firing alerts panels read ALERTS")
		for _, u := range mon.metrics() {
			if slices.Contains(alertMetrics, u.name) {
				require.Positive(t, prom.count(t, fmt.Sprintf("{__name__=%q}", u.name)), "%s has no series while an alert fires", u.name)
			}
		}

		// A relay on the same address drains the backlog, and the alert resolves.
		stop()
		t.Logf("%d orders placed while the relay was down", placed)
		cfg := s.ordersCfg
		cfg.RelayHTTPAddr = relayAddr
		relay, err := ordersapp.New(cfg, ordersapp.ModeRelay, s.ordersOpts)
		require.NoError(t, err)
		require.NoError(t, relay.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, relay.Stop()) })
		waitFor(t, 30*time.Second, "backlog drained and OutboxRelayStalled resolved", func() (bool, string) {
			b, ok := prom.scalar(t, backlog)
			active := slices.ContainsFunc(prom.alerts(t), isStalledOrders)
			return ok && b == 0 && !active, fmt.Sprintf("%s = %v (recorded: %v), alert active: %v", backlog, b, ok, active)
		})
	})
}

// splitShop is the shop with each service's API and relay as separate apps, as in the compose
// file, so that a relay can be stopped alone.
type splitShop struct {
	amqpURL                      string
	ordersCfg                    ordersapp.Config
	ordersOpts                   ordersapp.Options
	ordersAPI, ordersRelay       *ordersapp.App
	warehouseAPI, warehouseRelay *warehouseapp.App
	ordersURL, stockURL          string
}

// startSplitShop starts the split shop, each app of a service with that service's options.
//
// With ordersDB (a database on a server at wal_level=logical), the orders service runs there
// on the WAL relay (ORDERS_RELAY_MODE=wal); else on the shared server, polling.
func startSplitShop(t *testing.T, ordersDB string, ordersOpts ordersapp.Options, warehouseOpts warehouseapp.Options) *splitShop {
	t.Helper()
	ctx := context.Background()
	s := &splitShop{amqpURL: testinfra.AMQPURL(t), ordersOpts: ordersOpts}
	exchange, dlx := testinfra.UniqueName(t, "events"), testinfra.UniqueName(t, "dlx")
	// Dead-letter queues end in .dead, as in docs/events.md: the RabbitMQ rules and panels
	// tell them from work queues by that suffix.
	warehouseQueue, ordersQueue := testinfra.UniqueName(t, "warehouse"), testinfra.UniqueName(t, "orders")

	wcfg := warehouseapp.DefaultConfig()
	wcfg.DatabaseURL, wcfg.AMQPURL = testinfra.DatabaseURL(t), s.amqpURL
	wcfg.HTTPAddr, wcfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	wcfg.EventsExchange, wcfg.DeadLetterExchange = exchange, dlx
	wcfg.Queue, wcfg.DeadLetterQueue = warehouseQueue, warehouseQueue+".dead"
	wcfg.RelayPollInterval = 100 * time.Millisecond
	wcfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	wcfg.AdminTokenFile = adminTokenFile

	ocfg := ordersapp.DefaultConfig()
	ocfg.DatabaseURL, ocfg.AMQPURL = testinfra.DatabaseURL(t), s.amqpURL
	if ordersDB != "" {
		ocfg.DatabaseURL, ocfg.RelayMode = ordersDB, kit.RelayModeWAL
	}
	ocfg.HTTPAddr, ocfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	ocfg.EventsExchange, ocfg.DeadLetterExchange = exchange, dlx
	ocfg.Queue, ocfg.DeadLetterQueue = ordersQueue, ordersQueue+".dead"
	ocfg.RelayPollInterval = 100 * time.Millisecond
	ocfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	s.ordersCfg = ocfg
	t.Cleanup(func() {
		deleteTopology(t, s.amqpURL, []string{exchange, dlx}, wcfg.Queue, wcfg.DeadLetterQueue, ocfg.Queue, ocfg.DeadLetterQueue)
	})

	var err error
	// The APIs first: their consumers declare the queues, so that no event is unroutable.
	s.warehouseAPI, err = warehouseapp.New(wcfg, warehouseapp.ModeAPI, warehouseOpts)
	require.NoError(t, err)
	require.NoError(t, s.warehouseAPI.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.warehouseAPI.Stop()) })
	s.ordersAPI, err = ordersapp.New(ocfg, ordersapp.ModeAPI, ordersOpts)
	require.NoError(t, err)
	require.NoError(t, s.ordersAPI.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.ordersAPI.Stop()) })
	waitForConsumers(t, s.amqpURL, warehouseQueue, ordersQueue)

	s.warehouseRelay, err = warehouseapp.New(wcfg, warehouseapp.ModeRelay, warehouseOpts)
	require.NoError(t, err)
	require.NoError(t, s.warehouseRelay.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.warehouseRelay.Stop()) })
	s.ordersRelay, err = ordersapp.New(ocfg, ordersapp.ModeRelay, ordersOpts)
	require.NoError(t, err)
	require.NoError(t, s.ordersRelay.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.ordersRelay.Stop()) })

	s.ordersURL, s.stockURL = s.ordersAPI.URL(), "http://"+s.warehouseAPI.HTTPAddr()
	return s
}

// waitForConsumers waits until each queue exists and has a consumer.
func waitForConsumers(t *testing.T, amqpURL string, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	waitFor(t, 30*time.Second, "consumers on "+strings.Join(queues, ", "), func() (bool, string) {
		for _, q := range queues {
			ch, err := conn.Channel()
			if err != nil {
				return false, err.Error()
			}
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil) // a 404 closes the channel
			_ = ch.Close()
			switch {
			case err != nil:
				return false, q + ": " + err.Error()
			case info.Consumers == 0:
				return false, q + " has no consumer"
			}
		}
		return true, ""
	})
}

// placeOrders stocks a few SKUs scarcely and places n orders: half with an Idempotency-Key,
// some of those retried (replays), some cancelled, one read back; scarce stock rejects some.
func (s *splitShop) placeOrders(t *testing.T, n int) {
	t.Helper()
	stock := map[string]int64{"BOOK-1": 30, "MUG-1": 6, "TEE-1": 3}
	skus := slices.Sorted(maps.Keys(stock))
	for _, sku := range skus {
		code, _, _, err := call(http.MethodPut, s.stockURL+"/stock/"+sku, "", map[string]int64{"available": stock[sku]})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "restock %s", sku)
	}
	var replays, cancelled int
	for i := range n {
		req := orderRequest{
			CustomerID: fmt.Sprintf("customer-%d", i%7),
			Items:      []orderLine{{SKU: skus[i%len(skus)], Quantity: 1 + i%3}},
		}
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf("observability-order-%d", i)
		}
		code, replayed, got, err := call(http.MethodPost, s.ordersURL+"/orders", key, req)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, code, "order %d", i)
		require.False(t, replayed)
		if i%6 == 0 {
			code, replayed, again, err := call(http.MethodPost, s.ordersURL+"/orders", key, req)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, code)
			require.True(t, replayed, "a retry with the key is a replay")
			require.Equal(t, got.ID, again.ID)
			replays++
		}
		if i%4 == 1 {
			code, _, _, err := call(http.MethodPost, s.ordersURL+"/orders/"+got.ID+"/cancel", "", nil)
			require.NoError(t, err)
			require.Contains(t, []int{http.StatusOK, http.StatusConflict}, code, "cancel %s", got.ID) // 409: rejected first
			if code == http.StatusOK {
				cancelled++
			}
		}
		if i == 0 {
			code, _, _, err := call(http.MethodGet, s.ordersURL+"/orders/"+got.ID, "", nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
		}
	}
	t.Logf("placed %d orders: %d replays, %d cancelled", n, replays, cancelled)
}

// keepOrdering places an order every 100 ms until ctx is cancelled, and returns how many.
// It runs in its own goroutine, so it reports failures without stopping the test.
func (s *splitShop) keepOrdering(ctx context.Context, t *testing.T) int {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
		req := orderRequest{CustomerID: "customer-stalled", Items: []orderLine{{SKU: "BOOK-1", Quantity: 1}}}
		code, _, _, err := call(http.MethodPost, s.ordersURL+"/orders", "", req)
		if assert.NoError(t, err) && assert.Equal(t, http.StatusCreated, code) {
			n++
		}
	}
}

// deadLetterOne puts a message no handler understands (an unknown event type) on the orders
// queue: the consumer dead-letters it, so the dead-letter series exist.
func (s *splitShop) deadLetterOne(t *testing.T) {
	t.Helper()
	conn, err := amqp.Dial(s.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	confirm, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", s.ordersCfg.Queue, true, false, amqp.Publishing{
		MessageId:    testinfra.UniqueName(t, "poison"),
		Type:         "NotAStockEvent",
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Body:         []byte(`{}`),
	})
	require.NoError(t, err)
	acked, err := confirm.WaitContext(t.Context())
	require.NoError(t, err)
	require.True(t, acked, "the broker refused the poison message")
}

// rabbitmqMetricsAddr is where the broker's rabbitmq_prometheus plugin listens: the AMQP
// host, port 15692. Without it the test skips, or fails under CI=true.
func rabbitmqMetricsAddr(t *testing.T, amqpURL string) string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	addr := net.JoinHostPort(u.Hostname(), "15692")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		client.CloseIdleConnections()
		if resp.StatusCode == http.StatusOK {
			return addr
		}
		err = fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	msg := fmt.Sprintf("RabbitMQ's Prometheus endpoint on %s is unavailable (%v): enable the rabbitmq_prometheus plugin "+
		"(rabbitmq-plugins enable rabbitmq_prometheus) on the broker of %s", addr, err, testinfra.EnvAMQPURL)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so this is a failure")
	}
	t.Skip(msg)
	return ""
}

// scrape returns a /metrics page in the Prometheus text format.
func scrape(t *testing.T, url string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s:\n%s", url, body)
	return body
}

// hasLabels reports whether set carries every label of want.
func hasLabels(set model.LabelSet, want map[string]string) bool {
	for k, v := range want {
		if string(set[model.LabelName(k)]) != v {
			return false
		}
	}
	return true
}

func abbreviate(list []string, n int) string {
	if len(list) <= n {
		return strings.Join(list, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(list[:n], "; "), len(list)-n)
}

// createDatabase creates database db on the server of adminURL and returns its URL.
func createDatabase(t *testing.T, adminURL, db string) string {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	require.NoError(t, err)
	u, err := url.Parse(adminURL)
	require.NoError(t, err)
	u.Path = "/" + db
	return u.String()
}

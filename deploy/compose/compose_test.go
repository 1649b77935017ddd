package compose_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/template"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/distribution/reference"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestCompose(t *testing.T) {
	t.Parallel()

	t.Run("the services are those the shop, chaos and the monitoring name", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		var want []string
		for name := range goServices {
			want = append(want, name)
		}
		for _, name := range []string{"postgres", "rabbitmq", "prometheus", "alertmanager", "grafana", "jaeger"} {
			want = append(want, name)
		}
		want = append(want, oneShots...)
		require.ElementsMatch(t, want, slices.Collect(maps.Keys(p.Services)))
	})

	t.Run("every Go service is built from the Dockerfile with its binary and command", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		for name, role := range goServices {
			svc := p.Services[name]
			require.NotNil(t, svc.Build, "%s has no build", name)
			require.Equal(t, repoRoot, svc.Build.Context, "%s: build context", name)
			require.Equal(t, "Dockerfile", svc.Build.Dockerfile, "%s: Dockerfile", name)
			require.Equal(t, map[string]*string{"PKG": &role.pkg}, map[string]*string(svc.Build.Args), "%s: build args", name)
			require.Equal(t, types.PullPolicyBuild, svc.PullPolicy, "%s: pull_policy build, so that `up` never runs a stale binary", name)
			require.Equal(t, role.command, []string(svc.Command), "%s: command", name)
			require.DirExists(t, filepath.Join(svc.Build.Context, filepath.FromSlash(role.pkg)), "%s: PKG", name)
		}
	})

	t.Run("every build context and Dockerfile exists", func(t *testing.T) {
		t.Parallel()
		for name, svc := range project(t).Services {
			if svc.Build == nil {
				continue
			}
			require.DirExists(t, svc.Build.Context, "service %s", name)
			require.FileExists(t, filepath.Join(svc.Build.Context, svc.Build.Dockerfile), "service %s", name)
		}
	})

	t.Run("every bind-mounted file or folder exists", func(t *testing.T) {
		t.Parallel()
		mounts := 0
		for name, svc := range project(t).Services {
			for _, v := range svc.Volumes {
				if v.Type != types.VolumeTypeBind {
					continue
				}
				mounts++
				_, err := os.Stat(v.Source)
				require.NoError(t, err, "service %s mounts %s at %s", name, v.Source, v.Target)
				require.True(t, v.ReadOnly, "service %s: mount %s read-only", name, v.Target)
			}
		}
		require.Positive(t, mounts)
	})

	t.Run("every variable a Go service is given is one its binary reads, and every needed one is given", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(goServices)) {
			role := goServices[name]
			reads := programEnv(t, role.pkg)
			given := environment(t, p.Services[name])
			for _, k := range slices.Sorted(maps.Keys(given)) {
				if _, ok := reads[k]; !ok {
					errs = append(errs, fmt.Errorf("%s is given %s, which %s does not read", name, k, role.pkg))
				}
				if strings.Contains(given[k], "127.0.0.1") || strings.Contains(given[k], "localhost") {
					errs = append(errs, fmt.Errorf("%s: %s=%q names the container itself", name, k, given[k]))
				}
			}
			for _, k := range slices.Sorted(maps.Keys(reads)) {
				if v := reads[k]; v.NeedsValue() && given[k] == "" {
					errs = append(errs, fmt.Errorf("%s needs %s (%s, default %q), which it is not given", name, k, v.Where, v.Default))
				}
			}
		}
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("every variable an image of others is given is one it reads, and every needed one is given", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(p.Services)) {
			svc := p.Services[name]
			if _, ok := goServices[name]; ok {
				continue
			}
			facts, ok := thirdPartyImages[imageRepo(svc.Image)]
			require.True(t, ok, "service %s: image %s is not in thirdPartyImages", name, svc.Image)
			given := environment(t, svc)
			for _, k := range slices.Sorted(maps.Keys(given)) {
				if !slices.Contains(facts.env, k) {
					errs = append(errs, fmt.Errorf("%s is given %s, which is not among the variables of %s that this stack uses (%s)", name, k, imageRepo(svc.Image), facts.doc))
				}
			}
			for _, k := range facts.required {
				// A one-shot runs a command of its own in the image, not its server.
				if given[k] == "" && !slices.Contains(oneShots, name) {
					errs = append(errs, fmt.Errorf("%s needs %s", name, k))
				}
			}
		}
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("every Prometheus target is a service and a port it listens on", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		ports := listeningPorts(t, p)
		svc := p.Services["prometheus"]
		_, file := prometheusConfigFile(t, svc)
		require.Equal(t, repoPath("deploy", "prometheus", "prometheus.yml"), file)
		var cfg prometheusConfig
		readYAML(t, file, &cfg)

		var targets []target
		scraped := map[string]bool{}
		for _, sc := range cfg.ScrapeConfigs {
			for _, st := range sc.StaticConfigs {
				for _, hp := range st.Targets {
					tg, err := parseHostPort("scrape job "+sc.JobName, hp)
					require.NoError(t, err)
					targets = append(targets, tg)
					scraped[tg.host] = true
				}
			}
		}
		targets = append(targets, prometheusAlertmanagers(t, svc)...)
		require.NotEmpty(t, targets)
		require.NoError(t, errorsOf(targets, func(tg target) error { return checkTarget(p, ports, tg) }))
		for name, role := range goServices {
			require.Equal(t, role.scraped, scraped[name], "is %s scraped", name)
		}
		require.True(t, scraped["rabbitmq"], "rabbitmq is scraped")
	})

	t.Run("Prometheus reads the project's rules", func(t *testing.T) {
		t.Parallel()
		svc := project(t).Services["prometheus"]
		inContainer, file := prometheusConfigFile(t, svc)
		var cfg prometheusConfig
		readYAML(t, file, &cfg)
		require.NotEmpty(t, cfg.RuleFiles)
		for _, pattern := range cfg.RuleFiles {
			if !path.IsAbs(pattern) {
				pattern = path.Join(path.Dir(inContainer), pattern)
			}
			onHost := hostPath(svc, pattern)
			require.NotEmpty(t, onHost, "rule_files %s is not mounted", pattern)
			m, err := filepath.Glob(onHost)
			require.NoError(t, err)
			require.NotEmpty(t, m, "rule_files %s matches nothing", pattern)
		}
	})

	t.Run("Alertmanager's config is the project's and its webhooks reach the alert-logger", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		svc := p.Services["alertmanager"]
		require.Equal(t, repoPath("deploy", "alertmanager", "alertmanager.yml"), alertmanagerConfigFile(t, svc))
		hooks := alertmanagerWebhooks(t, svc)
		require.NotEmpty(t, hooks)
		ports := listeningPorts(t, p)
		require.NoError(t, errorsOf(hooks, func(wh webhook) error {
			tg, err := parseURLTarget(wh.where, wh.url)
			if err != nil {
				return err
			}
			if tg.host != "alert-logger" {
				return fmt.Errorf("%s posts to %s, not to the alert-logger", wh.where, wh.url)
			}
			return checkTarget(p, ports, tg)
		}))
	})

	t.Run("RabbitMQ runs the management and Prometheus plugins", func(t *testing.T) {
		t.Parallel()
		plugins := rabbitmqPlugins(t, project(t).Services["rabbitmq"])
		require.Subset(t, plugins, []string{"rabbitmq_management", "rabbitmq_prometheus"})
	})

	t.Run("Grafana is provisioned with the datasource, the dashboards and the home dashboard", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		svc := p.Services["grafana"]
		env := environment(t, svc)
		require.Equal(t, "true", env["GF_AUTH_ANONYMOUS_ENABLED"])
		require.Equal(t, "Viewer", env["GF_AUTH_ANONYMOUS_ORG_ROLE"])

		ports := listeningPorts(t, p)
		datasources := grafanaDatasources(t, svc)
		require.NotEmpty(t, datasources)
		require.NoError(t, errorsOf(datasources, func(ds grafanaDatasource) error {
			tg, err := parseURLTarget("grafana datasource "+ds.Name, ds.URL)
			if err != nil {
				return err
			}
			return checkTarget(p, ports, tg)
		}))

		providers := grafanaProviders(t, svc)
		require.NotEmpty(t, providers)
		var dashboardDirs []string
		for _, pr := range providers {
			require.Equal(t, "file", pr.Type, "provider %s", pr.Name)
			dir := hostPath(svc, pr.Options.Path)
			require.NotEmpty(t, dir, "provider %s: %s is not mounted", pr.Name, pr.Options.Path)
			require.DirExists(t, dir)
			m, err := filepath.Glob(filepath.Join(dir, "*.json"))
			require.NoError(t, err)
			require.NotEmpty(t, m, "provider %s: no dashboard in %s", pr.Name, dir)
			dashboardDirs = append(dashboardDirs, path.Clean(pr.Options.Path))
		}

		home := env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
		require.True(t, path.IsAbs(home), "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=%q", home)
		require.Contains(t, dashboardDirs, path.Dir(home), "the home dashboard is a provisioned one")
		file := hostPath(svc, home)
		require.NotEmpty(t, file, "%s is not mounted", home)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var dash struct {
			UID   string `json:"uid"`
			Title string `json:"title"`
		}
		require.NoError(t, json.Unmarshal(b, &dash))
		require.Equal(t, "outbox-inbox", dash.UID)
	})

	t.Run("the traced services export OTLP to Jaeger, which keeps and serves their traces", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		jaeger := p.Services["jaeger"]
		require.Equal(t, "jaegertracing/all-in-one", imageRepo(jaeger.Image))
		require.NoError(t, pinned(jaeger.Image))
		require.Equal(t, "true", environment(t, jaeger)["COLLECTOR_OTLP_ENABLED"])
		require.NotEmpty(t, environment(t, jaeger)["MEMORY_MAX_TRACES"], "spans in memory, bounded")
		hc := jaeger.HealthCheck
		require.NotNil(t, hc)
		require.Equal(t, []string{"CMD", "wget", "-q", "--spider", "http://127.0.0.1:14269/"}, []string(hc.Test), "the admin port's health")
		ports := listeningPorts(t, p)
		require.Subset(t, ports["jaeger"], []int{4317, 4318, 16686, 14269})

		var errs []error
		for _, name := range slices.Sorted(maps.Keys(goServices)) {
			env := environment(t, p.Services[name])
			serviceName, traced := tracedServices[name]
			if !traced {
				if _, ok := env["OTEL_EXPORTER_OTLP_ENDPOINT"]; ok {
					errs = append(errs, fmt.Errorf("%s exports spans but is not in tracedServices", name))
				}
				continue
			}
			endpoint := env["OTEL_EXPORTER_OTLP_ENDPOINT"]
			tg, err := parseURLTarget(name+" OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			switch {
			case err != nil:
				errs = append(errs, err)
			case tg.host != "jaeger" || tg.port != 4318:
				errs = append(errs, fmt.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT=%q, want Jaeger's OTLP/HTTP port, http://jaeger:4318", name, endpoint))
			}
			if p := env["OTEL_EXPORTER_OTLP_PROTOCOL"]; p != "http/protobuf" {
				errs = append(errs, fmt.Errorf("%s: OTEL_EXPORTER_OTLP_PROTOCOL=%q, want http/protobuf (port 4318)", name, p))
			}
			if env["OTEL_SERVICE_NAME"] != serviceName {
				errs = append(errs, fmt.Errorf("%s: OTEL_SERVICE_NAME=%q, want %q", name, env["OTEL_SERVICE_NAME"], serviceName))
			}
		}
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("Prometheus keeps exemplars and Grafana links them to their traces in Jaeger", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		require.Contains(t, []string(p.Services["prometheus"].Command), "--enable-feature=exemplar-storage")

		byUID := map[string]grafanaDatasource{}
		for _, ds := range grafanaDatasources(t, p.Services["grafana"]) {
			require.NotContains(t, byUID, ds.UID, "two datasources with uid %q", ds.UID)
			byUID[ds.UID] = ds
		}
		jaeger, ok := byUID["jaeger"]
		require.True(t, ok, "a datasource with uid jaeger")
		require.Equal(t, "jaeger", jaeger.Type)
		tg, err := parseURLTarget("grafana datasource "+jaeger.Name, jaeger.URL)
		require.NoError(t, err)
		require.Equal(t, target{where: tg.where, host: "jaeger", port: 16686}, tg, "Jaeger's query API")

		prom := byUID["prometheus"]
		require.Equal(t, "prometheus", prom.Type)
		dests := prom.JSONData.ExemplarTraceIDDestinations
		require.Len(t, dests, 1, "the Prometheus datasource's exemplarTraceIdDestinations")
		require.Equal(t, "trace_id", dests[0].Name, "the exemplar label the services write")
		require.Equal(t, "jaeger", dests[0].DatasourceUID, "an internal link to the Jaeger datasource")
		require.Empty(t, dests[0].URL)
	})

	t.Run("every service has a healthcheck that probes what it serves", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		ports := listeningPorts(t, p)
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(p.Services)) {
			svc := p.Services[name]
			hc := svc.HealthCheck
			if slices.Contains(oneShots, name) {
				if hc != nil && !hc.Disable {
					errs = append(errs, fmt.Errorf("%s runs once: a healthcheck would never pass after it exits", name))
				}
				continue
			}
			if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] == "NONE" {
				errs = append(errs, fmt.Errorf("%s has no healthcheck", name))
				continue
			}
			if hc.Test[0] != "CMD" {
				errs = append(errs, fmt.Errorf("%s: healthcheck %q: want the exec form [\"CMD\", …] (the Go images have no shell)", name, hc.Test))
				continue
			}
			if hc.Interval == nil || hc.Timeout == nil || hc.Retries == nil {
				errs = append(errs, fmt.Errorf("%s: healthcheck without interval, timeout or retries", name))
			}
			if _, ok := goServices[name]; ok {
				if hc.Test[1] != "/healthcheck" {
					errs = append(errs, fmt.Errorf("%s: healthcheck runs %s, not the image's /healthcheck", name, hc.Test[1]))
				}
			} else if facts := thirdPartyImages[imageRepo(svc.Image)]; !slices.Contains(facts.probes, hc.Test[1]) {
				errs = append(errs, fmt.Errorf("%s: healthcheck runs %s, which %s is not known to have (%v)", name, hc.Test[1], svc.Image, facts.probes))
			}
			for _, arg := range hc.Test[2:] {
				if !strings.HasPrefix(arg, "http://") && !strings.HasPrefix(arg, "https://") {
					continue
				}
				tg, err := parseURLTarget(name+" healthcheck", arg)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if tg.host == "127.0.0.1" || tg.host == "localhost" {
					if !slices.Contains(ports[name], tg.port) {
						errs = append(errs, fmt.Errorf("%s: healthcheck probes port %d, but it listens on %v", name, tg.port, ports[name]))
					}
					continue
				}
				if err := checkTarget(p, ports, tg); err != nil {
					errs = append(errs, err)
				}
			}
		}
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("depends_on waits for healthy services, in the order the queues need, without cycles", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(p.Services)) {
			svc := p.Services[name]
			for dep, d := range svc.DependsOn {
				if slices.Contains(oneShots, dep) && d.Condition != types.ServiceConditionCompletedSuccessfully {
					errs = append(errs, fmt.Errorf("%s depends on the one-shot %s with condition %q, want %s", name, dep, d.Condition, types.ServiceConditionCompletedSuccessfully))
				}
				if hc := p.Services[dep].HealthCheck; hc != nil && !hc.Disable && d.Condition != types.ServiceConditionHealthy {
					errs = append(errs, fmt.Errorf("%s depends on %s with condition %q, want %s", name, dep, d.Condition, types.ServiceConditionHealthy))
				}
			}
			// Whatever a service names in its environment and configuration, it waits for.
			for _, ref := range serviceReferences(t, p, svc) {
				if _, ok := svc.DependsOn[ref.host]; !ok {
					errs = append(errs, fmt.Errorf("%s names %s (%s) but does not depend on it", name, ref.host, ref.where))
				}
			}
		}
		// Each service declares the queue it consumes; an event published before its queue
		// exists is unroutable. So the relays wait for the consumers of their events.
		for _, edge := range [][2]string{
			{"orders-api", "warehouse"},
			{"orders-relay", "warehouse"},
			{"warehouse-relay", "orders-api"},
			{"loadgen", "orders-relay"},
			{"loadgen", "warehouse-relay"},
		} {
			if _, ok := p.Services[edge[0]].DependsOn[edge[1]]; !ok {
				errs = append(errs, fmt.Errorf("%s must depend on %s", edge[0], edge[1]))
			}
		}
		for name := range goServices {
			for _, infra := range []string{"postgres", "rabbitmq"} {
				if !dependsOnTransitively(p, name, infra) && name != "alert-logger" {
					errs = append(errs, fmt.Errorf("%s must start after %s", name, infra))
				}
			}
		}
		require.NoError(t, errors.Join(errs...))
		require.Nil(t, dependencyCycle(p), "depends_on cycle")
	})

	t.Run("every service restarts after a crash", func(t *testing.T) {
		t.Parallel()
		for name, svc := range project(t).Services {
			if slices.Contains(oneShots, name) {
				require.Equal(t, types.RestartPolicyOnFailure, svc.Restart, "service %s runs once: again after a failure, never after it exits 0", name)
				continue
			}
			require.Contains(t, []string{types.RestartPolicyUnlessStopped, types.RestartPolicyAlways, types.RestartPolicyOnFailure}, svc.Restart,
				"service %s: a SIGKILL exit (137) must restart it", name)
		}
	})

	t.Run("published ports are what a person opens, once each, on 127.0.0.1", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		listening := listeningPorts(t, p)
		byHostPort := map[string]string{}
		got := map[string]int{}
		for _, name := range slices.Sorted(maps.Keys(p.Services)) {
			for _, port := range p.Services[name].Ports {
				key := port.Published + "/" + port.Protocol
				require.NotContains(t, byHostPort, key, "host port %s published by %s and %s", key, byHostPort[key], name)
				byHostPort[key] = name
				require.Equal(t, "127.0.0.1", port.HostIP, "%s publishes %s on all interfaces", name, port.Published)
				require.Contains(t, listening[name], int(port.Target), "%s publishes port %d, which it does not listen on", name, port.Target)
				published, err := strconv.Atoi(port.Published)
				require.NoError(t, err)
				require.NotContains(t, got, name, "%s publishes two ports", name)
				got[name] = published
				require.Equal(t, int(port.Target), published, "%s: host port = container port", name)
			}
		}
		require.Equal(t, publishedPorts, got)
	})

	t.Run("every image has a version tag", func(t *testing.T) {
		t.Parallel()
		for name, svc := range project(t).Services {
			require.NoError(t, pinned(svc.Image), "service %s", name)
		}
	})
}

func dependsOnTransitively(p *types.Project, from, to string) bool {
	seen := map[string]bool{}
	var visit func(string) bool
	visit = func(s string) bool {
		if seen[s] {
			return false
		}
		seen[s] = true
		for dep := range p.Services[s].DependsOn {
			if dep == to || visit(dep) {
				return true
			}
		}
		return false
	}
	return visit(from)
}

// pinned reports whether image names a version: a tag other than latest, or a digest.
func pinned(image string) error {
	if image == "" {
		return errors.New("no image")
	}
	ref, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return fmt.Errorf("image %q: %w", image, err)
	}
	if _, ok := ref.(reference.Digested); ok {
		return nil
	}
	tagged, ok := ref.(reference.Tagged)
	if !ok {
		return fmt.Errorf("image %q has no tag", image)
	}
	if tagged.Tag() == "latest" {
		return fmt.Errorf("image %q uses latest", image)
	}
	return nil
}

func TestPinned(t *testing.T) {
	t.Parallel()
	for image, want := range map[string]string{
		"postgres:15.10-alpine":                     "",
		"gcr.io/distroless/static-debian12:nonroot": "",
		"golang@sha256:0123456789012345678901234567890123456789012345678901234567890123": "",
		"postgres":        "has no tag",
		"postgres:latest": "uses latest",
		"":                "no image",
		"Postgres:15":     "must be lowercase",
	} {
		t.Run(cmp.Or(image, "empty"), func(t *testing.T) {
			t.Parallel()
			err := pinned(image)
			if want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

// TestCredentials checks that every credential comes from the environment, with the demo
// defaults of .env.example, and that the services' URLs are built from them.
func TestCredentials(t *testing.T) {
	t.Parallel()

	raw, err := os.ReadFile(repoPath("docker-compose.yml"))
	require.NoError(t, err)

	t.Run("every interpolation has a default, equal to .env.example's", func(t *testing.T) {
		t.Parallel()
		for _, m := range regexp.MustCompile(`\$\{[^}]*\}`).FindAllString(string(raw), -1) {
			require.Regexp(t, `^\$\{[A-Z][A-Z0-9_]*:-[^}]*\}$`, m, "interpolations take the form ${VAR:-default}")
		}
		var model map[string]any
		require.NoError(t, yaml.Unmarshal(raw, &model))
		vars := template.ExtractVariables(model, template.DefaultPattern)
		example := envExample(t)
		require.ElementsMatch(t, slices.Collect(maps.Keys(example)), slices.Collect(maps.Keys(vars)),
			".env.example lists exactly the variables docker-compose.yml interpolates")
		for name, v := range vars {
			require.Equal(t, example[name], v.DefaultValue, "the default of ${%s} differs from .env.example", name)
		}
	})

	t.Run("with no environment the project is the one of .env.example", func(t *testing.T) {
		t.Parallel()
		bare, err := loadProject(t.Context(), false, nil)
		require.NoError(t, err)
		require.Equal(t, string(marshal(t, project(t))), string(marshal(t, bare)))
	})

	t.Run("credentials and URLs follow the environment", func(t *testing.T) {
		t.Parallel()
		probe := map[string]string{
			"POSTGRES_USER": "probe_pg_user", "POSTGRES_PASSWORD": "probe_pg_pass",
			"RABBITMQ_DEFAULT_USER": "probe_mq_user", "RABBITMQ_DEFAULT_PASS": "probe_mq_pass",
			"GF_SECURITY_ADMIN_USER": "probe_gf_user", "GF_SECURITY_ADMIN_PASSWORD": "probe_gf_pass",
		}
		p, err := loadProject(t.Context(), false, probe)
		require.NoError(t, err)

		env := func(svc string) map[string]string { return environment(t, p.Services[svc]) }
		require.Equal(t, "probe_pg_user", env("postgres")["POSTGRES_USER"])
		require.Equal(t, "probe_pg_pass", env("postgres")["POSTGRES_PASSWORD"])
		require.Equal(t, "probe_mq_user", env("rabbitmq")["RABBITMQ_DEFAULT_USER"])
		require.Equal(t, "probe_mq_pass", env("rabbitmq")["RABBITMQ_DEFAULT_PASS"])
		require.Equal(t, "probe_gf_user", env("grafana")["GF_SECURITY_ADMIN_USER"])
		require.Equal(t, "probe_gf_pass", env("grafana")["GF_SECURITY_ADMIN_PASSWORD"])
		require.Contains(t, p.Services["postgres"].HealthCheck.Test, "probe_pg_user")

		urls := 0
		for _, name := range slices.Sorted(maps.Keys(p.Services)) {
			for k, v := range env(name) {
				counted := false
				for _, one := range urlList(v) {
					u, err := url.Parse(one)
					if err != nil {
						continue
					}
					var wantUser, wantPass string
					var wantHosts []string
					switch u.Scheme {
					case "postgres", "postgresql":
						wantUser, wantPass, wantHosts = "probe_pg_user", "probe_pg_pass", []string{"postgres"}
					case "amqp", "amqps":
						wantUser, wantPass, wantHosts = "probe_mq_user", "probe_mq_pass", rabbitmqNodes
					default:
						continue
					}
					if !counted {
						urls, counted = urls+1, true
					}
					pass, _ := u.User.Password()
					require.Equal(t, wantUser, u.User.Username(), "%s %s", name, k)
					require.Equal(t, wantPass, pass, "%s %s", name, k)
					require.Contains(t, wantHosts, u.Hostname(), "%s %s", name, k)
				}
			}
		}
		require.Equal(t, 8, urls, "a database and a broker URL for each of the four shop processes")
	})

	t.Run("the database URLs name each service's own database", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		for svc, db := range map[string]string{"orders-api": "orders", "orders-relay": "orders", "warehouse": "warehouse", "warehouse-relay": "warehouse"} {
			prefix := strings.ToUpper(strings.SplitN(svc, "-", 2)[0])
			u, err := url.Parse(environment(t, p.Services[svc])[prefix+"_DATABASE_URL"])
			require.NoError(t, err)
			require.Equal(t, "/"+db, u.Path, "%s", svc)
			host, port, err := net.SplitHostPort(u.Host)
			require.NoError(t, err)
			require.Equal(t, "postgres", host)
			require.Equal(t, "5432", port)
		}
	})

	t.Run("no credential reaches the build context", func(t *testing.T) {
		t.Parallel()
		ignore := dockerignore(t)
		for _, f := range []string{".env", ".env.example", ".env.local"} {
			excluded, err := ignore.MatchesOrParentMatches(f)
			require.NoError(t, err)
			require.True(t, excluded, ".dockerignore must exclude %s", f)
		}
	})
}

package kubernetes_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cnpgv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	rabbitmqv1beta1 "github.com/rabbitmq/cluster-operator/v2/api/v1beta1"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository root: this module is deploy/kubernetes.
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

func repoPath(elem ...string) string { return filepath.Join(append([]string{repoRoot}, elem...)...) }

// object is one object of the build, decoded into its typed API.
type object struct {
	kind, name string
	obj        any
}

// kinds maps apiVersion and kind to a new value of the typed API that decodes it.
var kinds = map[string]func() any{
	"v1/Namespace":                            func() any { return new(corev1.Namespace) },
	"v1/Service":                              func() any { return new(corev1.Service) },
	"v1/ConfigMap":                            func() any { return new(corev1.ConfigMap) },
	"apps/v1/Deployment":                      func() any { return new(appsv1.Deployment) },
	"batch/v1/Job":                            func() any { return new(batchv1.Job) },
	"policy/v1/PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"rabbitmq.com/v1beta1/RabbitmqCluster":    func() any { return new(rabbitmqv1beta1.RabbitmqCluster) },
	"postgresql.cnpg.io/v1/Cluster":           func() any { return new(cnpgv1.Cluster) },
	"postgresql.cnpg.io/v1/Database":          func() any { return new(cnpgv1.Database) },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return new(monitoringv1.PodMonitor) },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return new(monitoringv1.ServiceMonitor) },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return new(monitoringv1.PrometheusRule) },
	"keda.sh/v1alpha1/ScaledObject":           func() any { return new(kedav1alpha1.ScaledObject) },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return new(networkingv1.NetworkPolicy) },
	"cert-manager.io/v1/Issuer":               func() any { return new(certmanagerv1.Issuer) },
	"cert-manager.io/v1/Certificate":          func() any { return new(certmanagerv1.Certificate) },
}

// build runs kustomize on this folder, as `kubectl apply -k deploy/kubernetes` does, and
// decodes every object strictly into its typed API.
var build = sync.OnceValues(func() ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	var objs []object
	for _, r := range m.Resources() {
		gvk := r.GetGvk()
		apiVersion := gvk.Version
		if gvk.Group != "" {
			apiVersion = gvk.Group + "/" + gvk.Version
		}
		key := apiVersion + "/" + gvk.Kind
		newObj, ok := kinds[key]
		if !ok {
			return nil, fmt.Errorf("%s %s: no typed API known for %s", gvk.Kind, r.GetName(), key)
		}
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", gvk.Kind, r.GetName(), err)
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict(y, obj); err != nil {
			return nil, fmt.Errorf("%s %s: strict decoding into %T: %w", gvk.Kind, r.GetName(), obj, err)
		}
		objs = append(objs, object{kind: gvk.Kind, name: r.GetName(), obj: obj})
	}
	return objs, nil
})

func objects(t *testing.T) []object {
	t.Helper()
	objs, err := build()
	require.NoError(t, err)
	require.NotEmpty(t, objs)
	return objs
}

// all returns the objects of type T in the build.
func all[T any](t *testing.T) []*T {
	t.Helper()
	var out []*T
	for _, o := range objects(t) {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// pod is a pod the build makes run: a Deployment's or one an operator makes for an object.
type pod struct {
	owner  string
	labels map[string]string
	ports  []corev1.ContainerPort
}

// service is a Service of the build or one an operator makes.
type service struct {
	name   string
	labels map[string]string
	ports  []corev1.ServicePort
	pods   []pod
}

// The RabbitMQ Cluster Operator labels the pods of a RabbitmqCluster and its client Service
// app.kubernetes.io/name=<name>, component rabbitmq, part-of rabbitmq; the pods are
// <name>-server-N behind the headless Service <name>-nodes, the client Service is <name>
// (with TLS only, spec.tls.disableNonTLSListeners: amqps 5671, management-tls 15671,
// prometheus-tls 15691), and the default user's Secret <name>-default-user.
// https://www.rabbitmq.com/kubernetes/operator/using-operator,
// https://www.rabbitmq.com/kubernetes/operator/using-operator#tls
func rabbitmqLabels(name string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name": name, "app.kubernetes.io/component": "rabbitmq", "app.kubernetes.io/part-of": "rabbitmq",
	}
}

var rabbitmqPorts = []corev1.ContainerPort{
	{Name: "amqps", ContainerPort: 5671}, {Name: "management-tls", ContainerPort: 15671}, {Name: "prometheus-tls", ContainerPort: 15691},
}

// rabbitmqNodePorts are the ports of the nodes among themselves (the pods', not the client
// Service's): epmd, Erlang distribution, and the CLI tools' range 35672-35682.
var rabbitmqNodePorts = []corev1.ContainerPort{
	{Name: "epmd", ContainerPort: 4369}, {Name: "cluster-links", ContainerPort: 25672}, {Name: "cli-tools", ContainerPort: 35672},
}

// CloudNativePG labels the instances of a Cluster cnpg.io/cluster=<name>, and makes the
// Services <name>-rw (the primary), <name>-ro and <name>-r, the application user's Secret
// <name>-app, and the CA that signs the servers' certificates, <name>-ca (ca.crt, ca.key).
// The instances serve PostgreSQL on 5432 and the instance manager's status on 8000 (for the
// operator). https://cloudnative-pg.io/documentation/current/service_management/,
// https://cloudnative-pg.io/documentation/current/certificates/
func cnpgLabels(name string) map[string]string { return map[string]string{"cnpg.io/cluster": name} }

// cluster is what the build makes run, the operators' objects included.
type cluster struct {
	pods     []pod
	services []service
	secrets  map[string][]string // name -> keys
	hosts    []string            // DNS names in the namespace
	config   map[string]bool     // ConfigMap names
}

func theCluster(t *testing.T) cluster {
	t.Helper()
	c := cluster{secrets: map[string][]string{}, config: map[string]bool{}}
	for _, d := range all[appsv1.Deployment](t) {
		var ports []corev1.ContainerPort
		for _, ctr := range d.Spec.Template.Spec.Containers {
			ports = append(ports, ctr.Ports...)
		}
		c.pods = append(c.pods, pod{owner: "Deployment " + d.Name, labels: d.Spec.Template.Labels, ports: ports})
	}
	for _, r := range all[rabbitmqv1beta1.RabbitmqCluster](t) {
		p := pod{owner: "RabbitmqCluster " + r.Name, labels: rabbitmqLabels(r.Name), ports: slices.Concat(rabbitmqPorts, rabbitmqNodePorts)}
		c.pods = append(c.pods, p)
		var sp []corev1.ServicePort
		for _, port := range rabbitmqPorts {
			sp = append(sp, corev1.ServicePort{Name: port.Name, Port: port.ContainerPort})
		}
		c.services = append(c.services, service{name: r.Name, labels: rabbitmqLabels(r.Name), ports: sp, pods: []pod{p}})
		c.secrets[r.Name+"-default-user"] = []string{"username", "password", "host", "port", "provider", "type", "default_user.conf", "connection_string"}
		c.hosts = append(c.hosts, r.Name)
		for i := range int(*r.Spec.Replicas) {
			c.hosts = append(c.hosts, fmt.Sprintf("%s-server-%d.%s-nodes", r.Name, i, r.Name))
		}
	}
	for _, pg := range all[cnpgv1.Cluster](t) {
		c.pods = append(c.pods, pod{owner: "Cluster " + pg.Name, labels: cnpgLabels(pg.Name), ports: []corev1.ContainerPort{{Name: "postgresql", ContainerPort: 5432}, {Name: "status", ContainerPort: 8000}}})
		c.secrets[pg.Name+"-app"] = []string{"username", "password", "host", "port", "dbname", "uri", "jdbc-uri", "pgpass"}
		c.secrets[pg.Name+"-ca"] = []string{"ca.crt", "ca.key"}
		c.hosts = append(c.hosts, pg.Name+"-rw", pg.Name+"-ro", pg.Name+"-r")
	}
	// cert-manager writes each Certificate's key and certificate, and its issuer's CA, to the
	// Certificate's Secret.
	for _, crt := range all[certmanagerv1.Certificate](t) {
		c.secrets[crt.Spec.SecretName] = []string{"tls.crt", "tls.key", "ca.crt"}
	}
	// The Secrets the person deploying creates (kustomization.yaml).
	for name, keys := range yourSecrets {
		c.secrets[name] = keys
	}
	for _, s := range all[corev1.Service](t) {
		c.hosts = append(c.hosts, s.Name)
		c.services = append(c.services, service{name: s.Name, labels: s.Labels, ports: s.Spec.Ports, pods: c.selectPods(labels.SelectorFromSet(s.Spec.Selector))})
	}
	for _, cm := range all[corev1.ConfigMap](t) {
		c.config[cm.Name] = true
		for k := range cm.Data {
			require.True(t, declared(t, k), "ConfigMap %s: %s is no setting of the services", cm.Name, k)
		}
	}
	return c
}

// yourSecrets are the Secrets the person deploying creates, as kustomization.yaml says: the
// warehouse's admin token, and each service's URLs built from the operators' Secrets.
var yourSecrets = map[string][]string{
	"warehouse-admin":      {"token"},
	"orders-connection":    {"database-url", "amqp-url"},
	"warehouse-connection": {"database-url", "amqp-url"},
}

func (c cluster) selectPods(sel labels.Selector) []pod {
	var out []pod
	if sel.Empty() {
		return nil
	}
	for _, p := range c.pods {
		if sel.Matches(labels.Set(p.labels)) {
			out = append(out, p)
		}
	}
	return out
}

func selector(t *testing.T, what string, ls *metav1.LabelSelector) labels.Selector {
	t.Helper()
	require.NotNil(t, ls, "%s has no selector", what)
	sel, err := metav1.LabelSelectorAsSelector(ls)
	require.NoError(t, err, what)
	require.False(t, sel.Empty(), "%s selects everything", what)
	return sel
}

func hasPort(ports []corev1.ContainerPort, name string) bool {
	return slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return p.Name == name })
}

func TestBuild(t *testing.T) {
	t.Parallel()
	objs := objects(t)
	got := map[string]int{}
	for _, o := range objs {
		got[o.kind]++
	}
	for kind, n := range map[string]int{
		"Deployment": 4, "Job": 2, "RabbitmqCluster": 1, "Cluster": 1, "Database": 2,
		"PrometheusRule": 1, "ScaledObject": 2, "PodMonitor": 1, "ServiceMonitor": 1,
		"NetworkPolicy": 7, "Issuer": 2, "Certificate": 2,
	} {
		require.Equal(t, n, got[kind], "number of %s objects", kind)
	}
	for _, o := range objs {
		if o.kind != "Namespace" {
			require.Equal(t, "outboxshop", o.obj.(metav1.Object).GetNamespace(), "%s %s", o.kind, o.name)
		}
	}

	t.Run("strict decoding fails on an unknown field", func(t *testing.T) {
		t.Parallel()
		err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"), new(appsv1.Deployment))
		require.ErrorContains(t, err, `unknown field "replica"`)
	})
}

// A Deployment and what its graceful stop may take: the variables whose values add up, and a
// preStop pause on top.
var gracefulStop = map[string][]string{
	"orders-api":      {"ORDERS_HTTP_SHUTDOWN_TIMEOUT", "ORDERS_CONSUMER_SHUTDOWN_TIMEOUT"},
	"orders-relay":    {"ORDERS_RELAY_CLAIM_TIMEOUT"},
	"warehouse":       {"WAREHOUSE_SHUTDOWN_TIMEOUT"},
	"warehouse-relay": {"WAREHOUSE_RELAY_CLAIM_TIMEOUT"},
}

// settingsSources are the Go files where the services' variables and their defaults are
// declared (caarlos0/env tags; the shared ones under the service's prefix).
var settingsSources = []string{
	"services/orders/app/config.go", "services/warehouse/app/config.go", "internal/service/wiring.go",
}

// settingDefault reads the envDefault of a variable from its declaration in the Go source:
// `env:"ORDERS_HTTP_SHUTDOWN_TIMEOUT" envDefault:"10s"`, or `env:"RELAY_CLAIM_TIMEOUT" …` in a
// struct the Config embeds under the prefix.
// declared reports whether the service variable name (ORDERS_…, WAREHOUSE_…) is declared in
// the Go source, on its own or in a struct embedded under its prefix.
func declared(t *testing.T, name string) bool {
	t.Helper()
	// Any setting can be given as a file (internal/envconfig): <VARIABLE>_FILE.
	if base, ok := strings.CutSuffix(name, "_FILE"); ok && declaredInSource(t, base) {
		return true
	}
	return declaredInSource(t, name)
}

func declaredInSource(t *testing.T, name string) bool {
	t.Helper()
	prefix, rest, _ := strings.Cut(name, "_")
	var all string
	for _, f := range settingsSources {
		b, err := os.ReadFile(repoPath(f))
		require.NoError(t, err)
		all += string(b)
	}
	return strings.Contains(all, `env:"`+name+`"`) ||
		(strings.Contains(all, `env:"`+prefix+`_"`) && strings.Contains(all, `env:"`+rest+`"`))
}

func settingDefault(t *testing.T, name string) time.Duration {
	t.Helper()
	prefix, rest, _ := strings.Cut(name, "_")
	var sources []string
	for _, f := range settingsSources {
		b, err := os.ReadFile(repoPath(f))
		require.NoError(t, err)
		sources = append(sources, string(b))
	}
	embedded := slices.ContainsFunc(sources, func(src string) bool { return strings.Contains(src, `env:"`+prefix+`_"`) })
	for _, n := range []string{name, rest} {
		if n == rest && !embedded {
			break
		}
		re := regexp.MustCompile(`env:"` + regexp.QuoteMeta(n) + `" envDefault:"([^"]+)"`)
		for _, src := range sources {
			if m := re.FindStringSubmatch(src); m != nil {
				d, err := time.ParseDuration(m[1])
				require.NoError(t, err, "%s default", name)
				return d
			}
		}
	}
	t.Fatalf("%s: no declaration with a default in %v", name, settingsSources)
	return 0
}

func TestDeployments(t *testing.T) {
	t.Parallel()
	c := theCluster(t)
	deployments := all[appsv1.Deployment](t)
	var names []string
	for _, d := range deployments {
		names = append(names, d.Name)
	}
	require.ElementsMatch(t, []string{"orders-api", "orders-relay", "warehouse", "warehouse-relay"}, names)
	pdbs := all[policyv1.PodDisruptionBudget](t)

	for _, d := range deployments {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			require.NotNil(t, d.Spec.Replicas)
			require.GreaterOrEqual(t, *d.Spec.Replicas, int32(2), "replicas")
			sel := selector(t, "Deployment "+d.Name, d.Spec.Selector)
			require.True(t, sel.Matches(labels.Set(d.Spec.Template.Labels)), "the selector selects the Deployment's own pods")
			// No other Deployment's pods: a rollout would count them as its own.
			for _, other := range deployments {
				if other != d {
					require.False(t, sel.Matches(labels.Set(other.Spec.Template.Labels)), "selects the pods of %s", other.Name)
				}
			}
			require.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, d.Spec.Strategy.Type)
			require.Zero(t, d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue(), "a rollout waits for a ready new pod before it stops an old one")

			spec := d.Spec.Template.Spec
			require.Len(t, spec.Containers, 1)
			ctr := spec.Containers[0]
			require.Len(t, ctr.Args, 1)
			require.Contains(t, []string{"api", "relay"}, ctr.Args[0], "the process's mode")
			for name, p := range map[string]*corev1.Probe{"startup": ctr.StartupProbe, "liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
				require.NotNil(t, p, "%s probe", name)
				require.NotNil(t, p.HTTPGet, "%s probe is an HTTP GET", name)
				require.True(t, hasPort(ctr.Ports, p.HTTPGet.Port.String()), "%s probe's port %s is one the container declares", name, p.HTTPGet.Port.String())
			}
			require.Equal(t, "/healthz", ctr.LivenessProbe.HTTPGet.Path)
			require.Equal(t, "/healthz", ctr.StartupProbe.HTTPGet.Path)
			require.Equal(t, "/readyz", ctr.ReadinessProbe.HTTPGet.Path)

			req, lim := ctr.Resources.Requests, ctr.Resources.Limits
			require.False(t, req.Cpu().IsZero(), "CPU request")
			require.False(t, req.Memory().IsZero(), "memory request")
			require.False(t, lim.Memory().IsZero(), "memory limit")
			require.LessOrEqual(t, req.Memory().Cmp(*lim.Memory()), 0, "memory request within the limit")

			// The graceful stop fits in the grace period.
			env := map[string]string{}
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
			var stop time.Duration
			vars, ok := gracefulStop[d.Name]
			require.True(t, ok, "gracefulStop names what %s's stop takes", d.Name)
			for _, v := range vars {
				dur := settingDefault(t, v)
				if s, ok := env[v]; ok {
					var err error
					dur, err = time.ParseDuration(s)
					require.NoError(t, err, v)
				}
				stop += dur
			}
			if ls := ctr.Lifecycle; ls != nil && ls.PreStop != nil {
				require.NotNil(t, ls.PreStop.Sleep, "preStop is a sleep (the image has no shell)")
				stop += time.Duration(ls.PreStop.Sleep.Seconds) * time.Second
			}
			require.NotNil(t, spec.TerminationGracePeriodSeconds)
			grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
			require.Greater(t, grace, stop, "terminationGracePeriodSeconds against %v and preStop", vars)

			// Hardened as the image allows: non-root, read-only, no privileges.
			require.True(t, *spec.SecurityContext.RunAsNonRoot)
			require.True(t, *ctr.SecurityContext.ReadOnlyRootFilesystem)
			require.False(t, *ctr.SecurityContext.AllowPrivilegeEscalation)
			require.Equal(t, []corev1.Capability{"ALL"}, ctr.SecurityContext.Capabilities.Drop)

			n := 0
			for _, pdb := range pdbs {
				if selector(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
					n++
				}
			}
			require.Equal(t, 1, n, "PodDisruptionBudgets covering %s", d.Name)

			checkPodSpec(t, c, "Deployment "+d.Name, spec)
		})
	}
}

func TestJobs(t *testing.T) {
	t.Parallel()
	c := theCluster(t)
	jobs := all[batchv1.Job](t)
	for _, j := range jobs {
		spec := j.Spec.Template.Spec
		require.Len(t, spec.Containers, 1, "Job %s", j.Name)
		ctr := spec.Containers[0]
		require.Equal(t, []string{"migrate"}, ctr.Args, "Job %s", j.Name)
		require.False(t, ctr.Resources.Requests.Cpu().IsZero(), "Job %s: CPU request", j.Name)
		require.False(t, ctr.Resources.Limits.Memory().IsZero(), "Job %s: memory limit", j.Name)
		checkPodSpec(t, c, "Job "+j.Name, spec)
	}
	var images []string
	for _, j := range jobs {
		images = append(images, j.Spec.Template.Spec.Containers[0].Image)
	}
	var want []string
	for _, d := range all[appsv1.Deployment](t) {
		if img := d.Spec.Template.Spec.Containers[0].Image; !slices.Contains(want, img) {
			want = append(want, img)
		}
	}
	require.ElementsMatch(t, want, images, "a migration Job for each service's image")
}

var (
	varRef   = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	urlHosts = regexp.MustCompile(`(?:postgres|amqps?)://[^@/]*@([^:/,?]+)`)
)

// pinned reports an image without a version tag, or with latest.
func pinned(image string) error {
	ref, _, _ := strings.Cut(image, "@")
	i := strings.LastIndex(ref, ":")
	if i < 0 || i < strings.LastIndex(ref, "/") {
		return fmt.Errorf("image %s has no tag", image)
	}
	if tag := ref[i+1:]; tag == "" || tag == "latest" {
		return fmt.Errorf("image %s is not pinned to a version", image)
	}
	return nil
}

// checkPodSpec checks what the containers of spec name: images, Secrets, ConfigMaps, $(VAR)
// references and the hosts of their database and broker URLs.
func checkPodSpec(t *testing.T, c cluster, what string, spec corev1.PodSpec) {
	t.Helper()
	for _, ctr := range spec.Containers {
		require.NoError(t, pinned(ctr.Image), "%s", what)
		for _, ef := range ctr.EnvFrom {
			require.NotNil(t, ef.ConfigMapRef, "%s: envFrom a ConfigMap only", what)
			require.True(t, c.config[ef.ConfigMapRef.Name], "%s: ConfigMap %s is not in the build", what, ef.ConfigMapRef.Name)
		}
		for _, v := range spec.Volumes {
			for ref := range secretRefs(v) {
				keys, ok := c.secrets[ref.name]
				require.True(t, ok, "%s: volume %s names Secret %s, which no object of the build makes nor kustomization.yaml says to create", what, v.Name, ref.name)
				if ref.key != "" {
					require.Contains(t, keys, ref.key, "%s: volume %s: key of Secret %s", what, v.Name, ref.name)
				}
			}
		}
		defined := map[string]bool{}
		for _, e := range ctr.Env {
			// A Secret reaches a process as a file, never through its environment.
			require.Nil(t, e.ValueFrom, "%s: %s is set from another object: a Secret is mounted as a file instead (<VARIABLE>_FILE)", what, e.Name)
			for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
				require.True(t, defined[m[1]], "%s: %s refers to $(%s), not defined before it", what, e.Name, m[1])
			}
			for _, m := range urlHosts.FindAllStringSubmatch(e.Value, -1) {
				require.Contains(t, c.hosts, m[1], "%s: %s names host %s", what, e.Name, m[1])
			}
			defined[e.Name] = true
			if strings.HasPrefix(e.Name, "ORDERS_") || strings.HasPrefix(e.Name, "WAREHOUSE_") {
				require.True(t, declared(t, e.Name), "%s: %s is no setting of the services", what, e.Name)
			}
		}
	}
}

func TestServicesAndMonitors(t *testing.T) {
	t.Parallel()
	c := theCluster(t)

	for _, s := range all[corev1.Service](t) {
		pods := c.selectPods(labels.SelectorFromSet(s.Spec.Selector))
		require.NotEmpty(t, pods, "Service %s selects no pod", s.Name)
		for _, port := range s.Spec.Ports {
			for _, p := range pods {
				require.True(t, hasPort(p.ports, port.TargetPort.String()), "Service %s: %s has no port %s", s.Name, p.owner, port.TargetPort.String())
			}
		}
	}
	for _, pdb := range all[policyv1.PodDisruptionBudget](t) {
		require.NotEmpty(t, c.selectPods(selector(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector)), "PodDisruptionBudget %s selects no pod", pdb.Name)
	}

	scraped := map[string]bool{}
	for _, pm := range all[monitoringv1.PodMonitor](t) {
		pods := c.selectPods(selector(t, "PodMonitor "+pm.Name, &pm.Spec.Selector))
		require.NotEmpty(t, pods, "PodMonitor %s selects no pod", pm.Name)
		for _, p := range pods {
			require.Contains(t, p.labels, pm.Spec.JobLabel, "PodMonitor %s: %s has no job label", pm.Name, p.owner)
			scraped[p.labels[pm.Spec.JobLabel]] = true
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				require.True(t, hasPort(p.ports, *ep.Port), "PodMonitor %s: %s has no port %s", pm.Name, p.owner, *ep.Port)
			}
		}
	}
	// The rules and dashboards read the jobs of deploy/prometheus/prometheus.yml.
	for _, job := range []string{"orders-api", "orders-relay", "warehouse", "warehouse-relay"} {
		require.True(t, scraped[job], "job %s is scraped", job)
	}
	for _, sm := range all[monitoringv1.ServiceMonitor](t) {
		sel := selector(t, "ServiceMonitor "+sm.Name, &sm.Spec.Selector)
		var matched []service
		for _, s := range c.services {
			if sel.Matches(labels.Set(s.labels)) {
				matched = append(matched, s)
			}
		}
		require.NotEmpty(t, matched, "ServiceMonitor %s selects no Service", sm.Name)
		for _, s := range matched {
			require.NotEmpty(t, s.pods, "ServiceMonitor %s: Service %s has no pods", sm.Name, s.name)
			for _, ep := range sm.Spec.Endpoints {
				require.True(t, slices.ContainsFunc(s.ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }),
					"ServiceMonitor %s: Service %s has no port %s", sm.Name, s.name, ep.Port)
			}
		}
	}
}

func TestScaledObjects(t *testing.T) {
	t.Parallel()
	metrics, err := os.ReadFile(repoPath("docs", "metrics.md"))
	require.NoError(t, err)
	const metric = "outbox_oldest_pending_age_seconds"
	require.Contains(t, string(metrics), "`"+metric+"`", "docs/metrics.md documents the metric")

	deployments := map[string]*appsv1.Deployment{}
	for _, d := range all[appsv1.Deployment](t) {
		deployments[d.Name] = d
	}
	var scaled []string
	for _, so := range all[kedav1alpha1.ScaledObject](t) {
		ref := so.Spec.ScaleTargetRef
		require.Contains(t, []string{"", "Deployment"}, ref.Kind, "ScaledObject %s", so.Name)
		d, ok := deployments[ref.Name]
		require.True(t, ok, "ScaledObject %s scales %s, not a Deployment of the build", so.Name, ref.Name)
		require.Equal(t, "relay", d.Spec.Template.Spec.Containers[0].Args[0], "ScaledObject %s scales relays", so.Name)
		scaled = append(scaled, ref.Name)
		require.NotNil(t, so.Spec.MinReplicaCount)
		require.GreaterOrEqual(t, *so.Spec.MinReplicaCount, *d.Spec.Replicas, "ScaledObject %s never scales below the Deployment's replicas", so.Name)
		require.Greater(t, *so.Spec.MaxReplicaCount, *so.Spec.MinReplicaCount)
		require.Len(t, so.Spec.Triggers, 1)
		tr := so.Spec.Triggers[0]
		require.Equal(t, "prometheus", tr.Type)
		q := tr.Metadata["query"]
		require.Contains(t, q, metric, "ScaledObject %s", so.Name)
		// The API process of the relay's service exports the metric (docs/metrics.md).
		service := strings.TrimSuffix(ref.Name, "-relay")
		job := map[string]string{"orders": "orders-api", "warehouse": "warehouse"}[service]
		require.Contains(t, q, `job="`+job+`"`, "ScaledObject %s reads its own service's outbox", so.Name)
		require.NotEmpty(t, tr.Metadata["serverAddress"])
		require.NotEmpty(t, tr.Metadata["threshold"])
	}
	require.ElementsMatch(t, []string{"orders-relay", "warehouse-relay"}, scaled)
}

func TestDataServices(t *testing.T) {
	t.Parallel()
	mqs := all[rabbitmqv1beta1.RabbitmqCluster](t)
	require.Len(t, mqs, 1)
	mq := mqs[0]
	require.Equal(t, int32(3), *mq.Spec.Replicas, "RabbitMQ nodes")
	require.NoError(t, pinned(mq.Spec.Image))
	require.False(t, mq.Spec.Resources.Limits.Memory().IsZero(), "RabbitMQ memory limit")
	require.Contains(t, mq.Spec.Rabbitmq.AdditionalConfig, "cluster_partition_handling = pause_minority")

	pgs := all[cnpgv1.Cluster](t)
	require.Len(t, pgs, 1)
	pg := pgs[0]
	require.Equal(t, 3, pg.Spec.Instances, "PostgreSQL instances")
	require.NoError(t, pinned(pg.Spec.ImageName))
	syncRep := pg.Spec.PostgresConfiguration.Synchronous
	require.NotNil(t, syncRep, "synchronous replication")
	require.GreaterOrEqual(t, syncRep.Number, 1)
	require.Less(t, syncRep.Number, pg.Spec.Instances, "a standby to spare")
	require.Equal(t, cnpgv1.DataDurabilityLevelRequired, syncRep.DataDurability, "a commit waits for a standby")
	require.False(t, pg.Spec.Resources.Limits.Memory().IsZero(), "PostgreSQL memory limit")

	var dbs []string
	for _, db := range all[cnpgv1.Database](t) {
		require.Equal(t, pg.Name, db.Spec.ClusterRef.Name)
		require.Equal(t, pg.Spec.Bootstrap.InitDB.Owner, db.Spec.Owner, "database %s is the application user's", db.Spec.Name)
		dbs = append(dbs, db.Spec.Name)
	}
	require.ElementsMatch(t, []string{"orders", "warehouse"}, dbs)
}

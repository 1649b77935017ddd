package kubernetes_test

import (
	"iter"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cnpgv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	rabbitmqv1beta1 "github.com/rabbitmq/cluster-operator/v2/api/v1beta1"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// secretRef is a key of a Secret a volume holds (key "" for all of them), and the file it is
// in the volume.
type secretRef struct{ name, key, file string }

// secretRefs yields the Secrets' keys a volume holds: a Secret volume's or a projected
// volume's Secret sources.
func secretRefs(v corev1.Volume) iter.Seq[secretRef] {
	return func(yield func(secretRef) bool) {
		one := func(name string, items []corev1.KeyToPath) bool {
			if len(items) == 0 {
				return yield(secretRef{name: name})
			}
			for _, it := range items {
				if !yield(secretRef{name: name, key: it.Key, file: it.Path}) {
					return false
				}
			}
			return true
		}
		if s := v.Secret; s != nil && !one(s.SecretName, s.Items) {
			return
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if s := src.Secret; s != nil && !one(s.Name, s.Items) {
					return
				}
			}
		}
	}
}

// fileSecret returns the Secret and key that the file at p of a container of spec is, from a
// read-only volume mount of a Secret or projected Secrets, readable by the pod's fsGroup and
// no one else; ok is false when p is in no such volume.
func fileSecret(t *testing.T, what string, spec corev1.PodSpec, ctr corev1.Container, p string) (name, key string, ok bool) {
	t.Helper()
	dir, file := path.Split(p)
	for _, m := range ctr.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/")+"/" != dir {
			continue
		}
		require.True(t, m.ReadOnly, "%s: the volume of %s is mounted read-only", what, p)
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var mode *int32
			switch {
			case v.Secret != nil:
				mode = v.Secret.DefaultMode
			case v.Projected != nil:
				mode = v.Projected.DefaultMode
			}
			require.NotNil(t, mode, "%s: volume %s has a mode", what, v.Name)
			require.Zero(t, *mode&0o007, "%s: volume %s is not readable by others", what, v.Name)
			require.NotNil(t, spec.SecurityContext.FSGroup, "%s: the nonroot process reads %s through the pod's fsGroup", what, v.Name)
			for ref := range secretRefs(v) {
				if ref.key != "" && ref.file == file {
					return ref.name, ref.key, true
				}
			}
		}
	}
	return "", "", false
}

// TestCredentialsFromFiles: every shop process reads its database URL, its broker URL (the
// migrations have none) and the CAs that sign the servers' certificates from files of
// mounted Secrets, through <SERVICE>_…_FILE; no URL, password or token is in the
// environment.
func TestCredentialsFromFiles(t *testing.T) {
	t.Parallel()
	type podSpec struct {
		what, service string
		spec          corev1.PodSpec
		broker        bool
	}
	var pods []podSpec
	for _, d := range all[appsv1.Deployment](t) {
		pods = append(pods, podSpec{"Deployment " + d.Name, d.Spec.Template.Spec.Containers[0].Name, d.Spec.Template.Spec, true})
	}
	for _, j := range all[batchv1.Job](t) {
		pods = append(pods, podSpec{"Job " + j.Name, j.Spec.Template.Spec.Containers[0].Name, j.Spec.Template.Spec, false})
	}
	require.Len(t, pods, 6)
	// The container is named after its service (orders, warehouse), as its image is.
	for _, p := range pods {
		require.Contains(t, []string{"orders", "warehouse"}, p.service, "%s", p.what)
	}
	for _, p := range pods {
		t.Run(p.what, func(t *testing.T) {
			t.Parallel()
			ctr := p.spec.Containers[0]
			prefix := strings.ToUpper(p.service) + "_"
			want := map[string][2]string{
				prefix + "DATABASE_URL_FILE": {p.service + "-connection", "database-url"},
				prefix + "DATABASE_CA_FILE":  {"shop-db-ca", "ca.crt"},
			}
			if p.broker {
				want[prefix+"AMQP_URL_FILE"] = [2]string{p.service + "-connection", "amqp-url"}
				want[prefix+"AMQP_CA_FILE"] = [2]string{"shop-mq-tls", "ca.crt"}
			}
			got := map[string][2]string{}
			for _, e := range ctr.Env {
				require.Nil(t, e.ValueFrom, "%s: %s from another object", p.what, e.Name)
				for _, secret := range []string{"_URL", "PASSWORD", "TOKEN", "_USER"} {
					require.False(t, strings.HasSuffix(e.Name, secret), "%s: %s is a value in the environment: give it as a file", p.what, e.Name)
				}
				require.NotRegexp(t, `://[^/]*@`, e.Value, "%s: %s holds a URL with credentials", p.what, e.Name)
				if !strings.HasSuffix(e.Name, "_FILE") || e.Name == "WAREHOUSE_ADMIN_TOKEN_FILE" {
					continue
				}
				name, key, ok := fileSecret(t, p.what, p.spec, ctr, e.Value)
				require.True(t, ok, "%s: %s=%s is no file of a mounted Secret", p.what, e.Name, e.Value)
				got[e.Name] = [2]string{name, key}
			}
			require.Equal(t, want, got, "%s: the Secrets and keys its settings read as files", p.what)
			// The server's key never reaches a shop pod: of shop-mq-tls, ca.crt alone.
			for _, v := range p.spec.Volumes {
				for ref := range secretRefs(v) {
					if ref.name == "shop-mq-tls" || ref.name == "shop-db-ca" {
						require.Equal(t, "ca.crt", ref.key, "%s: volume %s holds %s of %s", p.what, v.Name, ref.key, ref.name)
					}
				}
			}
		})
	}
}

// TestTLS: the broker serves TLS only, with a certificate for every name the shop's URLs
// use; the database's URLs verify the server (sslmode=verify-full) and no TCP connection
// without TLS is accepted; and the URLs the person deploying creates, as kustomization.yaml
// and docs/production.md show, are amqps:// to every node on 5671 and postgres:// with
// sslmode=verify-full.
func TestTLS(t *testing.T) {
	t.Parallel()
	c := theCluster(t)
	mq := all[rabbitmqv1beta1.RabbitmqCluster](t)[0]
	require.NotNil(t, mq.Spec.TLS, "RabbitmqCluster %s: spec.tls", mq.Name)
	require.True(t, mq.Spec.TLS.DisableNonTLSListeners, "RabbitmqCluster %s: the plain listeners are off", mq.Name)
	certs := map[string]*certmanagerv1.Certificate{}
	for _, crt := range all[certmanagerv1.Certificate](t) {
		certs[crt.Spec.SecretName] = crt
	}
	crt, ok := certs[mq.Spec.TLS.SecretName]
	require.True(t, ok, "RabbitmqCluster %s: its certificate's Secret %s is a Certificate's", mq.Name, mq.Spec.TLS.SecretName)
	require.Contains(t, c.secrets[mq.Spec.TLS.CaSecretName], "ca.crt", "RabbitmqCluster %s: caSecretName holds ca.crt", mq.Name)
	require.False(t, crt.Spec.IsCA)
	require.Equal(t, "Issuer", crt.Spec.IssuerRef.Kind)

	pg := all[cnpgv1.Cluster](t)[0]
	require.Contains(t, pg.Spec.PostgresConfiguration.PgHBA, "hostnossl all all 0.0.0.0/0 reject")
	require.Contains(t, pg.Spec.PostgresConfiguration.PgHBA, "hostnossl all all ::/0 reject")
	// CloudNativePG's server certificate names its Services (<svc>, .<ns>, .<ns>.svc, …).
	pgNames := []string{}
	for _, svc := range []string{"-rw", "-ro", "-r"} {
		pgNames = append(pgNames, pg.Name+svc, pg.Name+svc+"."+pg.Namespace, pg.Name+svc+"."+pg.Namespace+".svc")
	}

	// The commands that create the URLs' Secrets, the same in both places.
	kust, err := os.ReadFile("kustomization.yaml")
	require.NoError(t, err)
	var cmds []string
	inBlock := false
	for line := range strings.Lines(string(kust)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "#   get() {") {
			inBlock = true
		}
		if inBlock && line == "#" {
			break
		}
		if inBlock {
			cmds = append(cmds, strings.TrimPrefix(line, "#   "))
		}
	}
	require.NotEmpty(t, cmds, "kustomization.yaml shows how to create the URLs' Secrets")
	doc, err := os.ReadFile(repoPath("docs", "production.md"))
	require.NoError(t, err)
	for _, cmd := range cmds {
		require.Contains(t, string(doc), cmd, "docs/production.md shows the command of kustomization.yaml")
	}
	script := strings.Join(cmds, "\n")

	// postgres://…@shop-db-rw:5432/$svc?sslmode=verify-full for each service's Secret.
	dbURL := regexp.MustCompile(`--from-file=database-url=<\(printf %s "(postgres://[^"]+)"\)`).FindStringSubmatch(script)
	require.NotNil(t, dbURL, "the database URL")
	require.Regexp(t, `\?sslmode=verify-full$`, dbURL[1])
	host := urlHosts.FindStringSubmatch(dbURL[1])[1]
	require.Equal(t, pg.Name+"-rw", host, "the URL goes to the primary")
	require.Contains(t, pgNames, host, "the server's certificate names the URL's host")
	require.Contains(t, script, "for svc in orders warehouse; do")
	require.Contains(t, script, "kubectl -n outboxshop create secret generic $svc-connection")
	require.Contains(t, script, `--from-file=amqp-url=<(printf %s "${amqp_url%,}")`)
	require.NotContains(t, script, "--from-literal", "no URL with its password as an argument of kubectl")

	// amqps://…@shop-mq-server-N.shop-mq-nodes:5671/ for each node.
	node := regexp.MustCompile(`for i in ([0-9 ]+); do printf '(amqps?)://%s:%s@([a-z0-9-]+)-%d\.([a-z0-9-]+):(\d+)/,'`).FindStringSubmatch(script)
	require.NotNil(t, node, "the broker URL")
	require.Equal(t, "amqps", node[2])
	require.Equal(t, "5671", node[5])
	require.Equal(t, mq.Name+"-server", node[3])
	require.Equal(t, mq.Name+"-nodes", node[4])
	var idx []string
	for i := range int(*mq.Spec.Replicas) {
		idx = append(idx, strconv.Itoa(i))
		h := node[3] + "-" + strconv.Itoa(i) + "." + node[4]
		require.Contains(t, c.hosts, h)
		require.True(t, certNames(crt.Spec.DNSNames, h), "the broker's certificate names %s", h)
	}
	require.Equal(t, strings.Join(idx, " "), node[1], "a URL for every node")
	require.Contains(t, crt.Spec.DNSNames, mq.Name+"."+mq.Namespace+".svc", "Prometheus's serverName")
}

// certNames reports whether a certificate for names is valid for host (a wildcard stands for
// one leftmost label).
func certNames(names []string, host string) bool {
	for _, n := range names {
		if n == host {
			return true
		}
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			if _, after, found := strings.Cut(host, "."); found && after == rest {
				return true
			}
		}
	}
	return false
}

package compose_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// shopPrefixes are the shop processes that dial the broker and the database, by the prefix of
// their variables.
var shopPrefixes = map[string]string{
	"orders-api": "ORDERS_", "orders-relay": "ORDERS_", "warehouse": "WAREHOUSE_", "warehouse-relay": "WAREHOUSE_",
}

// imageUsers are the owners the servers need of their keys: the users of the images' alpine
// variants (addgroup/adduser in the Dockerfiles of docker-library/rabbitmq and
// docker-library/postgres).
var imageUsers = map[string][2]uint32{"rabbitmq": {100, 101}, "postgres": {70, 70}}

// volumeFile returns the named volume that holds containerPath in svc and the path inside it,
// or "" when no named volume covers it.
func volumeFile(svc types.ServiceConfig, containerPath string) (volume, rel string, readOnly bool) {
	bestLen := -1
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeVolume {
			continue
		}
		target := path.Clean(v.Target)
		r, ok := strings.CutPrefix(path.Clean(containerPath), target+"/")
		if !ok || len(target) <= bestLen {
			continue
		}
		volume, rel, readOnly, bestLen = v.Source, r, v.ReadOnly, len(target)
	}
	return volume, rel, readOnly
}

// generatedFile checks that containerPath in svc is in a volume that tls-certs writes, mounted
// read-only, and returns where tls-certs writes it in its own container.
func generatedFile(t *testing.T, p *types.Project, svc types.ServiceConfig, containerPath string) string {
	t.Helper()
	volume, rel, ro := volumeFile(svc, containerPath)
	require.NotEmpty(t, volume, "%s: %s is in no named volume", svc.Name, containerPath)
	require.True(t, ro, "%s mounts the volume %s read-only", svc.Name, volume)
	for _, v := range p.Services["tls-certs"].Volumes {
		if v.Type == types.VolumeTypeVolume && v.Source == volume {
			require.False(t, v.ReadOnly, "tls-certs writes the volume %s", volume)
			return path.Join(v.Target, rel)
		}
	}
	require.Failf(t, "not generated", "%s: %s is in the volume %s, which tls-certs does not write", svc.Name, containerPath, volume)
	return ""
}

// commandOption returns the value of -c name=value in a postgres command line.
func commandOption(command []string, name string) string {
	for i, arg := range command {
		if arg == "-c" && i+1 < len(command) {
			if v, ok := strings.CutPrefix(command[i+1], name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// tlsFiles are the files that the stack's services read from the volumes of tls-certs, by
// where tls-certs writes them.
type tlsFiles struct {
	shopCA              map[string]string // a shop process's CA files (AMQP and database) → tls-certs path
	mqCA, mqCert, mqKey string
	pgCert, pgKey       string
}

func tlsFilesOf(t *testing.T, p *types.Project) tlsFiles {
	t.Helper()
	f := tlsFiles{shopCA: map[string]string{}}
	for name, prefix := range shopPrefixes {
		env := environment(t, p.Services[name])
		for _, k := range []string{prefix + "AMQP_CA_FILE", prefix + "DATABASE_CA_FILE"} {
			require.NotEmpty(t, env[k], "%s: %s", name, k)
			f.shopCA[name+" "+k] = generatedFile(t, p, p.Services[name], env[k])
		}
	}
	for _, node := range rabbitmqNodes {
		svc, ok := p.Services[node]
		if !ok {
			continue
		}
		conf := rabbitmqConf(t, svc)
		ca, cert, key := generatedFile(t, p, svc, conf["ssl_options.cacertfile"]),
			generatedFile(t, p, svc, conf["ssl_options.certfile"]), generatedFile(t, p, svc, conf["ssl_options.keyfile"])
		if f.mqCert == "" {
			f.mqCA, f.mqCert, f.mqKey = ca, cert, key
		}
		require.Equal(t, []string{f.mqCA, f.mqCert, f.mqKey}, []string{ca, cert, key}, "%s: the files of %s", node, rabbitmqNodes[0])
	}
	pg := p.Services["postgres"]
	f.pgCert = generatedFile(t, p, pg, commandOption(pg.Command, "ssl_cert_file"))
	f.pgKey = generatedFile(t, p, pg, commandOption(pg.Command, "ssl_key_file"))
	return f
}

func TestTLS(t *testing.T) {
	t.Parallel()

	t.Run("tls-certs runs the committed script, in the nodes' image, before what reads its volumes", func(t *testing.T) {
		t.Parallel()
		for _, p := range []*types.Project{project(t), clusterProject(t)} {
			svc := p.Services["tls-certs"]
			require.Empty(t, svc.Profiles, "tls-certs runs in every profile")
			require.Equal(t, p.Services["rabbitmq"].Image, svc.Image, "the rabbitmq image: it has openssl and is pulled anyway")
			require.Len(t, svc.Command, 3)
			require.Equal(t, "sh", svc.Command[0])
			require.Equal(t, repoPath("deploy", "compose", "tls-certs.sh"), hostPath(svc, svc.Command[1]), "the script is the committed one")
			require.Empty(t, svc.DependsOn)
			require.Empty(t, svc.Ports)
			written := map[string]bool{}
			for _, v := range svc.Volumes {
				if v.Type == types.VolumeTypeVolume {
					require.Equal(t, svc.Command[2], path.Dir(v.Target), "tls-certs writes %s under its output folder", v.Source)
					written[v.Source] = true
				}
			}
			require.NotEmpty(t, written)
			for name, other := range p.Services {
				for _, v := range other.Volumes {
					if name == svc.Name || !written[v.Source] {
						continue
					}
					require.True(t, v.ReadOnly, "%s mounts %s read-only", name, v.Source)
					dep, ok := other.DependsOn[svc.Name]
					require.True(t, ok, "%s reads %s: it waits for tls-certs", name, v.Source)
					require.Equal(t, types.ServiceConditionCompletedSuccessfully, dep.Condition, name)
					require.True(t, dep.Required, name)
				}
			}
		}
	})

	t.Run("every shop process dials every node and the database over TLS, trusting the generated CA", func(t *testing.T) {
		t.Parallel()
		for _, p := range []*types.Project{project(t), clusterProject(t)} {
			f := tlsFilesOf(t, p)
			for name, prefix := range shopPrefixes {
				env := environment(t, p.Services[name])
				for _, one := range urlList(env[prefix+"AMQP_URL"]) {
					require.Regexp(t, `^amqps://[^@]+@rabbitmq(-2|-3)?:5671/$`, one, "%s %sAMQP_URL", name, prefix)
				}
				require.Regexp(t, `^postgres://[^@]+@postgres:5432/[a-z]+\?sslmode=verify-full$`, env[prefix+"DATABASE_URL"], name)
				for _, k := range []string{"AMQP_CERT_FILE", "AMQP_KEY_FILE", "DATABASE_CERT_FILE", "DATABASE_KEY_FILE"} {
					require.NotContains(t, env, prefix+k, "%s: no client certificate is asked for", name)
				}
			}
			// One CA, the one that signed the servers' certificates (the script's run below).
			cas := map[string]bool{}
			for _, ca := range f.shopCA {
				cas[ca] = true
			}
			require.Len(t, cas, 1, "the shop's CA files: %v", f.shopCA)
		}
	})

	t.Run("every node serves AMQP over TLS on 5671, the profiled ones nothing else", func(t *testing.T) {
		t.Parallel()
		p := clusterProject(t)
		ports := listeningPorts(t, p)
		for _, node := range rabbitmqNodes {
			conf := rabbitmqConf(t, p.Services[node])
			require.Equal(t, "5671", conf["listeners.ssl.default"], node)
			require.Contains(t, ports[node], 5671, node)
			if node == "rabbitmq" {
				// The chaos runner publishes 5672 to the host and dials it (chaos/compose.go).
				require.Contains(t, ports[node], 5672, node)
				continue
			}
			require.Equal(t, "none", conf["listeners.tcp"], "%s: no plain listener", node)
			require.NotContains(t, ports[node], 5672, node)
		}
		tlsFilesOf(t, p) // the nodes' files are generated and mounted read-only
	})

	t.Run("postgres serves TLS with the generated certificate", func(t *testing.T) {
		t.Parallel()
		cmd := project(t).Services["postgres"].Command
		require.Equal(t, "on", commandOption(cmd, "ssl"))
		require.NotEmpty(t, commandOption(cmd, "ssl_cert_file"))
		require.NotEmpty(t, commandOption(cmd, "ssl_key_file"))
		tlsFilesOf(t, project(t))
	})

	t.Run("the script issues what the servers and the shop read, for the names the shop dials", func(t *testing.T) {
		t.Parallel()
		if _, err := exec.LookPath("openssl"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("no openssl to run deploy/compose/tls-certs.sh with; CI=true, so this is a failure")
			}
			t.Skip("no openssl to run deploy/compose/tls-certs.sh with")
		}
		p := clusterProject(t)
		f := tlsFilesOf(t, p)
		svc := p.Services["tls-certs"]
		out := t.TempDir()
		onHost := func(inContainer string) string {
			rel, ok := strings.CutPrefix(inContainer, svc.Command[2]+"/")
			require.True(t, ok, inContainer)
			return filepath.Join(out, filepath.FromSlash(rel))
		}
		run := func() string {
			cmd := exec.Command("sh", repoPath("deploy", "compose", "tls-certs.sh"), out)
			b, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", b)
			return string(b)
		}
		run()

		roots := x509.NewCertPool()
		ca, err := os.ReadFile(onHost(f.mqCA))
		require.NoError(t, err)
		require.True(t, roots.AppendCertsFromPEM(ca))
		for k, file := range f.shopCA {
			b, err := os.ReadFile(onHost(file))
			require.NoError(t, err, k)
			require.Equal(t, ca, b, k)
		}
		verify := func(certFile, keyFile, owner string, hosts ...string) {
			pair, err := tls.LoadX509KeyPair(onHost(certFile), onHost(keyFile))
			require.NoError(t, err, "%s and %s are a pair", certFile, keyFile)
			cert, err := x509.ParseCertificate(pair.Certificate[0])
			require.NoError(t, err)
			for _, host := range hosts {
				_, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				require.NoError(t, err, "the certificate of %s for %s", certFile, host)
			}
			fi, err := os.Stat(onHost(keyFile))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s: readable by its owner alone", keyFile)
			if os.Geteuid() == 0 {
				st := fi.Sys().(*syscall.Stat_t)
				require.Equal(t, imageUsers[owner], [2]uint32{st.Uid, st.Gid}, "%s: owned by the user of the %s image", keyFile, owner)
			}
		}
		verify(f.mqCert, f.mqKey, "rabbitmq", rabbitmqNodes...)
		verify(f.pgCert, f.pgKey, "postgres", "postgres")

		// What the shop mounts holds no key, nor does anything hold the CA's.
		privateKey := regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----`)
		shopDirs := map[string]bool{}
		for _, file := range f.shopCA {
			shopDirs[filepath.Dir(onHost(file))] = true
		}
		keys := 0
		require.NoError(t, filepath.WalkDir(out, func(file string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if privateKey.Match(b) {
				keys++
				require.False(t, shopDirs[filepath.Dir(file)], "%s: a key where the shop reads its CA", file)
			}
			return nil
		}))
		require.Equal(t, 2, keys, "the nodes' key and the database's; not the CA's")

		// A second run keeps what is there.
		before, err := os.ReadFile(onHost(f.mqCert))
		require.NoError(t, err)
		require.Contains(t, run(), "in place")
		after, err := os.ReadFile(onHost(f.mqCert))
		require.NoError(t, err)
		require.Equal(t, before, after)
	})

	t.Run("no private key is in the repository", func(t *testing.T) {
		t.Parallel()
		cmd := exec.Command("git", "ls-files", "-z")
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		require.NoError(t, err, "git ls-files")
		privateKey := regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----`)
		files := 0
		for file := range bytes.SplitSeq(bytes.TrimRight(out, "\x00"), []byte{0}) {
			name := string(file)
			files++
			require.False(t, slices.Contains([]string{".key", ".p12", ".pfx"}, filepath.Ext(name)), "%s is committed", name)
			b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(name)))
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			require.NoError(t, err)
			require.False(t, privateKey.Match(b), "%s holds a private key", name)
		}
		require.Positive(t, files)
	})
}

package compose_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// rabbitmqNodes are the RabbitMQ services of the profile cluster: rabbitmq runs in every
// profile, the two others join it.
var rabbitmqNodes = []string{"rabbitmq", "rabbitmq-2", "rabbitmq-3"}

// theClusterProject is the compose project under `docker compose --profile cluster`.
var theClusterProject = sync.OnceValues(func() (*types.Project, error) {
	o, err := cli.NewProjectOptions([]string{repoPath("docker-compose.yml")},
		cli.WithWorkingDirectory(repoRoot), cli.WithEnvFiles(repoPath(".env.example")), cli.WithDotEnv,
		cli.WithProfiles([]string{"cluster"}))
	if err != nil {
		return nil, err
	}
	return o.LoadProject(context.Background())
})

func clusterProject(t *testing.T) *types.Project {
	t.Helper()
	p, err := theClusterProject()
	require.NoError(t, err, "load docker-compose.yml with the profile cluster")
	return p
}

// classicConfigNodes reads the node list of a rabbitmq.conf's classic peer discovery.
func classicConfigNodes(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var nodes []string
	backend := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s: %q", file, line)
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case k == "cluster_formation.peer_discovery_backend":
			backend = v
		case strings.HasPrefix(k, "cluster_formation.classic_config.nodes."):
			nodes = append(nodes, v)
		}
	}
	require.NoError(t, sc.Err())
	require.Equal(t, "classic_config", backend, "%s: peer discovery backend", file)
	return nodes
}

func TestClusterProfile(t *testing.T) {
	t.Parallel()

	t.Run("the profile adds the two other RabbitMQ nodes and nothing else", func(t *testing.T) {
		t.Parallel()
		base, cl := project(t), clusterProject(t)
		added := slices.DeleteFunc(slices.Collect(maps.Keys(cl.Services)), func(s string) bool { _, ok := base.Services[s]; return ok })
		require.ElementsMatch(t, []string{"rabbitmq-2", "rabbitmq-3"}, added)
		for _, name := range added {
			require.Equal(t, []string{"cluster"}, cl.Services[name].Profiles, "%s runs only under the profile", name)
		}
		require.Empty(t, base.Services["rabbitmq"].Profiles, "rabbitmq runs in every profile")
	})

	t.Run("the nodes run one pinned image with one Erlang cookie from .env", func(t *testing.T) {
		t.Parallel()
		p := clusterProject(t)
		cookie := envExample(t)["RABBITMQ_ERLANG_COOKIE"]
		require.NotEmpty(t, cookie, ".env.example sets RABBITMQ_ERLANG_COOKIE")
		image := p.Services["rabbitmq"].Image
		require.NoError(t, pinned(image))
		for _, name := range rabbitmqNodes {
			svc := p.Services[name]
			require.Equal(t, image, svc.Image, "%s: the image of rabbitmq", name)
			require.Equal(t, name, svc.Hostname, "%s: its node name is rabbit@%s", name, name)
			require.Equal(t, cookie, environment(t, svc)["RABBITMQ_ERLANG_COOKIE"], "%s: cookie", name)
			require.Contains(t, []string{types.RestartPolicyUnlessStopped, types.RestartPolicyAlways}, svc.Restart, name)
			require.Subset(t, rabbitmqPlugins(t, svc), []string{"rabbitmq_management", "rabbitmq_prometheus"}, name)
			n := 0
			for _, v := range svc.Volumes {
				if v.Target == "/var/lib/rabbitmq" {
					require.Equal(t, types.VolumeTypeVolume, v.Type, "%s: data in a named volume", name)
					n++
				}
			}
			require.Equal(t, 1, n, "%s: a data volume of its own", name)
		}
		// Each node's data in its own volume.
		seen := map[string]string{}
		for _, name := range rabbitmqNodes {
			for _, v := range p.Services[name].Volumes {
				if v.Target == "/var/lib/rabbitmq" {
					require.NotContains(t, seen, v.Source, "%s shares the data volume of %s", name, seen[v.Source])
					seen[v.Source] = name
				}
			}
		}
	})

	t.Run("the joining nodes discover all three and wait for rabbitmq", func(t *testing.T) {
		t.Parallel()
		p := clusterProject(t)
		var want []string
		for _, name := range rabbitmqNodes {
			want = append(want, "rabbit@"+name)
		}
		for _, name := range rabbitmqNodes[1:] {
			svc := p.Services[name]
			conf := ""
			for _, v := range svc.Volumes {
				if v.Type == types.VolumeTypeBind && strings.HasPrefix(v.Target, "/etc/rabbitmq/conf.d/") && v.Source == repoPath("deploy", "rabbitmq", "cluster.conf") {
					conf = v.Source
				}
			}
			require.NotEmpty(t, conf, "%s mounts deploy/rabbitmq/cluster.conf in /etc/rabbitmq/conf.d", name)
			nodes := classicConfigNodes(t, conf)
			require.Equal(t, want, nodes, "%s: peers, rabbit@rabbitmq first (the node the others join)", name)
			dep, ok := svc.DependsOn["rabbitmq"]
			require.True(t, ok, "%s waits for rabbitmq", name)
			require.Equal(t, types.ServiceConditionHealthy, dep.Condition)
		}
	})

	t.Run("the joining nodes are healthy only once all three run in the cluster", func(t *testing.T) {
		t.Parallel()
		p := clusterProject(t)
		for _, name := range rabbitmqNodes[1:] {
			hc := p.Services[name].HealthCheck
			require.NotNil(t, hc, name)
			require.Equal(t, []string{"CMD", "rabbitmqctl", "-q", "await_online_nodes", fmt.Sprint(len(rabbitmqNodes))}, []string(hc.Test), name)
			require.NotNil(t, hc.Timeout, name)
			require.NotNil(t, hc.Retries, name)
		}
	})

	t.Run("every shop process is given every node and waits for it", func(t *testing.T) {
		t.Parallel()
		p := clusterProject(t)
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(goServices)) {
			prefix := map[string]string{"orders": "ORDERS_", "warehouse": "WAREHOUSE_"}[strings.SplitN(name, "-", 2)[0]]
			if prefix == "" {
				continue // loadgen, alert-logger: no broker
			}
			v := environment(t, p.Services[name])[prefix+"AMQP_URL"]
			var hosts []string
			for _, one := range urlList(v) {
				u, err := url.Parse(one)
				require.NoError(t, err, "%s %sAMQP_URL", name, prefix)
				require.Equal(t, "amqps", u.Scheme, "%s %sAMQP_URL: TLS to every node", name, prefix)
				require.Equal(t, "5671", u.Port(), "%s %sAMQP_URL", name, prefix)
				hosts = append(hosts, u.Hostname())
			}
			if !slices.Equal(rabbitmqNodes, hosts) {
				errs = append(errs, fmt.Errorf("%s: %sAMQP_URL names %v, want every node %v", name, prefix, hosts, rabbitmqNodes))
			}
			for _, node := range rabbitmqNodes {
				dep, ok := p.Services[name].DependsOn[node]
				if !ok || dep.Condition != types.ServiceConditionHealthy {
					errs = append(errs, fmt.Errorf("%s does not wait for %s to be healthy", name, node))
				}
			}
		}
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("without the profile a shop process waits for rabbitmq, and for the others only when they run", func(t *testing.T) {
		t.Parallel()
		p := project(t)
		for _, name := range []string{"orders-api", "orders-relay", "warehouse", "warehouse-relay"} {
			deps := p.Services[name].DependsOn
			require.True(t, deps["rabbitmq"].Required, "%s requires rabbitmq", name)
			for _, node := range rabbitmqNodes[1:] {
				// required: false, or `docker compose up` without the profile refuses to start.
				require.False(t, deps[node].Required, "%s: its dependency on %s is not required", name, node)
				require.NotContains(t, p.Services, node, "%s runs only under the profile", node)
			}
		}
	})
}

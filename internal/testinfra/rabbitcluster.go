package testinfra

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// RabbitCluster is private RabbitMQ nodes joined in one cluster, for tests that kill a node
// under a client (see [RabbitNode] for what each node has of its own). The nodes share an
// Erlang cookie of their own; the machine's broker and its cookie are left alone.
//
// A cluster of three takes about 25 seconds to start on two cores (the nodes start in
// parallel, then join one at a time): share one per test binary with [SharedRabbitCluster].
type RabbitCluster struct {
	Nodes []*RabbitNode
}

// StartRabbitCluster starts a cluster of size nodes with the given extra rabbitmq.conf lines
// and stops it when the test ends. Without a local RabbitMQ installation the test is skipped,
// or fails under CI=true.
func StartRabbitCluster(t testing.TB, size int, conf ...string) *RabbitCluster {
	t.Helper()
	c, err := startRabbitCluster(size, conf)
	if c != nil {
		t.Cleanup(c.stop)
	}
	if err != nil {
		if _, missing := errors.AsType[*missingError](err); missing {
			unavailable(t, "a private RabbitMQ cluster", err)
		}
		t.Fatalf("private RabbitMQ cluster: %v", err)
	}
	return c
}

var (
	sharedClusterOnce sync.Once
	sharedCluster     *RabbitCluster
	sharedClusterErr  error
)

// SharedRabbitCluster returns the test binary's three-node cluster, started by the first
// test that asks and stopped by [Main] when the tests are over. A test that kills a node
// restarts it before it ends (the next test expects three running nodes), and uses queue
// names of its own.
func SharedRabbitCluster(t testing.TB) *RabbitCluster {
	t.Helper()
	sharedClusterOnce.Do(func() { sharedCluster, sharedClusterErr = startRabbitCluster(3, nil) })
	if sharedClusterErr != nil {
		if _, missing := errors.AsType[*missingError](sharedClusterErr); missing {
			unavailable(t, "a private RabbitMQ cluster", sharedClusterErr)
		}
		t.Fatalf("private RabbitMQ cluster: %v", sharedClusterErr)
	}
	return sharedCluster
}

// stopSharedCluster stops the shared cluster, if a test started it.
func stopSharedCluster() {
	if sharedCluster != nil {
		sharedCluster.stop()
	}
}

func startRabbitCluster(size int, conf []string) (*RabbitCluster, error) {
	if size < 1 {
		return nil, fmt.Errorf("a cluster of %d nodes", size)
	}
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	cookie := strings.ToUpper(hex.EncodeToString(b))
	c := &RabbitCluster{}
	for range size {
		n, err := newRabbitNode(conf, cookie)
		if n != nil {
			c.Nodes = append(c.Nodes, n)
		}
		if err != nil {
			return c, err
		}
	}
	// Start every node at once: most of a node's start-up is its own VM booting.
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() {
			if err := n.launch(); err != nil {
				errs[i] = err
				return
			}
			errs[i] = n.waitReady(time.Now().Add(120 * time.Second))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	// Join the others to the first, one at a time (joins to one seed in parallel race in
	// the schema database).
	for _, n := range c.Nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.Nodes[0].Name}, {"start_app"}} {
			if _, err := n.ctl(args...); err != nil {
				return c, fmt.Errorf("join the cluster: %w", err)
			}
		}
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			return c, err
		}
	}
	return c, nil
}

// URLs are the nodes' AMQP URLs, in the order of Nodes.
func (c *RabbitCluster) URLs() []string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL
	}
	return urls
}

// Node returns the node whose AMQP address ([RabbitNode.Addr]) or Erlang node name is
// nameOrAddr, or nil.
func (c *RabbitCluster) Node(nameOrAddr string) *RabbitNode {
	for _, n := range c.Nodes {
		if n.Addr() == nameOrAddr || n.Name == nameOrAddr {
			return n
		}
	}
	return nil
}

// Leader returns the node that leads the quorum queue queue (in the default vhost), asking
// through the CLI of a node other than except (nil: any), which may be down.
func (c *RabbitCluster) Leader(t testing.TB, queue string, except *RabbitNode) *RabbitNode {
	t.Helper()
	var errs []error
	for _, n := range c.Nodes {
		if n == except {
			continue
		}
		out, err := n.ctl("list_queues", "-q", "--formatter", "json", "name", "leader")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var queues []struct{ Name, Leader string }
		if err := json.Unmarshal([]byte(out), &queues); err != nil {
			t.Fatalf("list_queues: %v\n%s", err, out)
		}
		for _, q := range queues {
			if q.Name == queue {
				if l := c.Node(q.Leader); l != nil {
					return l
				}
				t.Fatalf("queue %s is led by %q, not a node of the cluster", queue, q.Leader)
			}
		}
		t.Fatalf("queue %s not found", queue)
	}
	t.Fatalf("no node answered list_queues: %v", errors.Join(errs...))
	return nil
}

func (c *RabbitCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Go(n.stop)
	}
	wg.Wait()
}

package outboxrabbitmqmetrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, url)
	u, err := amqp.ParseURI(url)
	require.NoError(t, err)
	proxy := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", u.Host, u.Port))

	reg := prometheus.NewPedanticRegistry()
	m, err := outboxrabbitmqmetrics.NewPublisher(reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		seen []bool
	)
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: proxy.RewriteURL(t, url), Hooks: m.Hooks(outboxrabbitmq.Hooks{
		Connected: func(c outboxrabbitmq.ConnectionChange) { mu.Lock(); seen = append(seen, c.Up); mu.Unlock() },
	})})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	msg := outbox.Message{Exchange: top.Exchange, RoutingKey: "k", Type: "T", AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`)}
	publish := func() error { return pub.Publish(ctx, []outbox.Message{msg})[0] }

	// expect publishes until the metrics read connected and reconnects.
	expect := func(connected, reconnects int) {
		t.Helper()
		want := fmt.Sprintf(`
# HELP outbox_broker_connected 1 while the publisher has a broker connection.
# TYPE outbox_broker_connected gauge
outbox_broker_connected{service="test"} %d
# HELP outbox_broker_reconnects_total Successful broker connects after the first.
# TYPE outbox_broker_reconnects_total counter
outbox_broker_reconnects_total{service="test"} %d
`, connected, reconnects)
		var err error
		testinfra.Eventually(t, 10*time.Second, func() bool {
			if perr := publish(); (perr == nil) != (connected == 1) {
				return false
			}
			err = testutil.GatherAndCompare(reg, strings.NewReader(want))
			return err == nil
		}, "broker_connected %d, reconnects %d", connected, reconnects)
		require.NoError(t, err)
	}

	expect(1, 0)
	proxy.Cut()
	expect(0, 0)
	proxy.Heal()
	expect(1, 1)
	mu.Lock()
	require.Equal(t, []bool{true, false, true}, slices.Compact(seen), "the caller's own hook still runs")
	mu.Unlock()

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "metric naming problems")
}

// TestPublisherConnections follows a publisher with two connections through its hook: the
// gauge is 1 while either is open, and each connection's first connect is not a reconnect.
func TestPublisherConnections(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := outboxrabbitmqmetrics.NewPublisher(reg, nil)
	require.NoError(t, err)
	connected := m.Hooks(outboxrabbitmq.Hooks{}).Connected
	expect := func(up, reconnects int) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP outbox_broker_connected 1 while the publisher has a broker connection.
# TYPE outbox_broker_connected gauge
outbox_broker_connected %d
# HELP outbox_broker_reconnects_total Successful broker connects after the first.
# TYPE outbox_broker_reconnects_total counter
outbox_broker_reconnects_total %d
`, up, reconnects))))
	}
	for _, step := range []struct {
		change         outboxrabbitmq.ConnectionChange
		up, reconnects int
	}{
		{outboxrabbitmq.ConnectionChange{Up: true, Connection: 0, Open: 1}, 1, 0},
		{outboxrabbitmq.ConnectionChange{Up: true, Connection: 1, Open: 2}, 1, 0},  // its first connect
		{outboxrabbitmq.ConnectionChange{Up: false, Connection: 0, Open: 1}, 1, 0}, // the other is open
		{outboxrabbitmq.ConnectionChange{Up: false, Connection: 1, Open: 0}, 0, 0},
		{outboxrabbitmq.ConnectionChange{Up: false, Connection: 1, Open: 0}, 0, 0}, // a failed dial
		{outboxrabbitmq.ConnectionChange{Up: true, Connection: 1, Open: 1}, 1, 1},
		{outboxrabbitmq.ConnectionChange{Up: true, Connection: 0, Open: 2}, 1, 2},
	} {
		connected(step.change)
		expect(step.up, step.reconnects)
	}
}

// TestImportsOnlyTheAdapter: the adapter's metrics depend on the adapter, and the core's
// metrics package is not among their dependencies.
func TestImportsOnlyTheAdapter(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		require.False(t, strings.HasSuffix(dep, "/outbox/metrics"), "depends on the core's metrics: %s", dep)
	}
}

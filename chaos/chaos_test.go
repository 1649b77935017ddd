package chaos

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestScenarios runs every scenario but those marked OutsideCI against the local target, as
// `make chaos` does: private PostgreSQL servers (a primary and its standby for pg-failover and
// pg-flap-failover) and a private RabbitMQ node (a three-node cluster for broker-node-kill;
// servers of its own that take TLS alone for tls; everything in network namespaces of its own
// for the partition scenarios), the service binaries built fresh, about ten minutes in all.
// Without initdb, rabbitmq-server, or (for the network lab) root, ip and nft, it skips, saying
// so; under CI=true that is a failure instead. -short skips it.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the chaos scenarios take about seven to ten minutes; run them with make chaos")
	}
	if missing := MissingTools(); len(missing) > 0 {
		msg := "the chaos scenarios need " + strings.Join(missing, ", ") + " (the local target starts private servers)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; skipped (under CI=true this fails)")
	}

	// The canary's crash point is never reached: it must fail, or the runner would let a
	// scenario whose fault did not happen pass.
	canary := crashScenario("canary-never-reached", OrdersRelay, pointRelayAfterPublish, "a crash point armed beyond the load", nil)
	canary.Failpoints = func(float64) map[Service]string {
		return map[Service]string{OrdersRelay: pointRelayAfterPublish + "=kill@1000000"}
	}
	inject := canary.Inject
	canary.Inject = func(ctx context.Context, e *Env) error {
		ctx, cancel := context.WithDeadline(ctx, e.LoadStart.Add(e.Load+2*time.Second))
		defer cancel()
		return inject(ctx, e)
	}

	scenarios := slices.DeleteFunc(Scenarios(), func(s Scenario) bool { return s.OutsideCI })
	if missing := MissingNetworkTools(); len(missing) > 0 {
		msg := "the partition scenarios need " + strings.Join(missing, ", ") + " (the network lab)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Log(msg + "; left out (under CI=true this fails)")
		scenarios = slices.DeleteFunc(scenarios, func(s Scenario) bool { return s.Network })
	}
	outcomes, err := Run(t.Context(), append(scenarios, canary), Options{Target: NewLocal(LocalConfig{}), Progress: t.Output()})
	require.NoError(t, err)
	require.Len(t, outcomes, len(scenarios)+1)
	outcomes, last := outcomes[:len(outcomes)-1], outcomes[len(outcomes)-1]
	t.Log("\n" + Table(outcomes))
	t.Run("FaultNotInjectedFails", func(t *testing.T) {
		require.False(t, last.Passed(), "a scenario whose crash point was never reached passed")
		require.Len(t, last.Failures, 1, "everything else held: %v", last.Failures)
		require.Contains(t, last.Failures[0], "fault not injected: orders-relay never died at its crash point relay.after-publish")
	})
	for _, o := range outcomes {
		t.Run(o.Scenario, func(t *testing.T) {
			if o.Passed() {
				return
			}
			// The logs first and the failure last: CI keeps the tail of a long output.
			for _, svc := range slices.Sorted(maps.Keys(o.Logs)) {
				t.Logf("last lines of %s:\n%s", svc, o.Logs[svc])
			}
			t.Errorf("%s", Details([]Outcome{o}))
		})
	}
}

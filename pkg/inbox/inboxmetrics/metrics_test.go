package inboxmetrics_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
)

func TestWindow(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	w, err := inboxmetrics.NewWindow(reg, prometheus.Labels{"service": "test"})
	require.NoError(t, err)
	w.Set("warehouse", 7*24*time.Hour, inboxmetrics.RetryWindow(5, time.Second, 30*time.Second))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP inbox_retention_seconds How long processed message ids are kept.
# TYPE inbox_retention_seconds gauge
inbox_retention_seconds{consumer="warehouse",service="test"} 604800
# HELP inbox_redelivery_window_seconds The longest time in which a duplicate can still arrive.
# TYPE inbox_redelivery_window_seconds gauge
inbox_redelivery_window_seconds{consumer="warehouse",service="test"} 15
`)))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestRetryWindow(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Duration(0), inboxmetrics.RetryWindow(1, time.Second, time.Minute))
	require.Equal(t, 7*time.Second, inboxmetrics.RetryWindow(4, time.Second, time.Minute))    // 1+2+4
	require.Equal(t, 17*time.Second, inboxmetrics.RetryWindow(6, time.Second, 5*time.Second)) // 1+2+4+5+5
}

// TestImportsNoBroker proves that the inbox's metrics import only what they measure: neither
// the RabbitMQ adapter nor its client library.
func TestImportsNoBroker(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/prometheus/client_golang/prometheus", "go list -deps lists the dependencies")
	for _, dep := range deps {
		require.NotContains(t, dep, "amqp091-go", "pkg/inbox/inboxmetrics depends on the RabbitMQ client")
		require.False(t, strings.HasSuffix(dep, "/rabbitmq") || strings.Contains(dep, "/rabbitmq/"),
			"pkg/inbox/inboxmetrics depends on the RabbitMQ adapter %s", dep)
	}
}

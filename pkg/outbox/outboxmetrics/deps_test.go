package outboxmetrics_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsNoBroker proves that the core's metrics import only what they measure: neither
// the RabbitMQ adapter nor its client library, so an adopter on another broker does not
// compile them in.
func TestImportsNoBroker(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/prometheus/client_golang/prometheus", "go list -deps lists the dependencies")
	for _, dep := range deps {
		require.NotContains(t, dep, "amqp091-go", "pkg/outbox/outboxmetrics depends on the RabbitMQ client")
		require.False(t, strings.HasSuffix(dep, "rabbitmq") || strings.Contains(dep, "rabbitmq/"),
			"pkg/outbox/outboxmetrics depends on the RabbitMQ adapter %s", dep)
	}
}

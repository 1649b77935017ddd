package outbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsNoOTelSDK: every package of the library, tests aside, takes its tracing through
// OpenTelemetry's API only, so an adopter who does not trace compiles no SDK and no exporter
// in (docs/tracing.md).
func TestImportsNoOTelSDK(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "go.opentelemetry.io/otel/trace", "go list -deps lists the dependencies")
	for _, dep := range deps {
		require.False(t, strings.HasPrefix(dep, "go.opentelemetry.io/otel/sdk") || strings.HasPrefix(dep, "go.opentelemetry.io/otel/exporters"),
			"a package of the library depends on %s", dep)
	}
}

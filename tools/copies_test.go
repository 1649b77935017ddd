package tools_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryCopiesInStep: pkg/outbox and pkg/inbox each keep their own copy of the
// documentation-snippet check, so that either folder can be copied alone. The copies must
// stay the same apart from their package clause; change both together.
func TestLibraryCopiesInStep(t *testing.T) {
	t.Parallel()
	body := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		_, rest, ok := strings.Cut(string(b), "\n")
		require.True(t, ok, "%s: empty", path)
		return rest
	}
	require.Equal(t, body("../pkg/outbox/snippets_test.go"), body("../pkg/inbox/snippets_test.go"),
		"pkg/outbox/snippets_test.go and pkg/inbox/snippets_test.go have drifted apart")
}

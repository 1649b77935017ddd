package tools_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
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

// TestMigrationRunnerCopiesInStep: pkg/outbox/internal/pgmigrate and
// pkg/inbox/internal/pgmigrate, the migration runner and its templates' renderer, are one
// package kept as two identical copies, so that either library can be copied alone. Every
// file of one must be in the other, byte for byte; change both together.
func TestMigrationRunnerCopiesInStep(t *testing.T) {
	t.Parallel()
	requireSameDirs(t, "../pkg/outbox/internal/pgmigrate", "../pkg/inbox/internal/pgmigrate")
}

// TestRetryCopiesInStep: internal/retry, the backoff and the log-once streak of every
// background loop, is one package kept as three identical copies: the service kit's and
// each library's. Change all three together.
func TestRetryCopiesInStep(t *testing.T) {
	t.Parallel()
	requireSameDirs(t, "../internal/retry", "../pkg/outbox/internal/retry", "../pkg/inbox/internal/retry")
}

// requireSameDirs fails unless every directory holds the same files, byte for byte.
func requireSameDirs(t *testing.T, dirs ...string) {
	t.Helper()
	files := func(dir string) map[string]string {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		out := map[string]string{}
		for _, e := range entries {
			require.False(t, e.IsDir(), "%s/%s: the copies hold no directories", dir, e.Name())
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			out[e.Name()] = string(b)
		}
		require.NotEmpty(t, out, "%s is empty", dir)
		return out
	}
	first := files(dirs[0])
	for _, dir := range dirs[1:] {
		other := files(dir)
		require.Equal(t, slices.Sorted(maps.Keys(first)), slices.Sorted(maps.Keys(other)),
			"%s and %s hold different files", dirs[0], dir)
		for name, body := range first {
			require.Equal(t, body, other[name], "%s differs between %s and %s", name, dirs[0], dir)
		}
	}
}

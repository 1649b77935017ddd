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
	outbox, inbox := files("../pkg/outbox/internal/pgmigrate"), files("../pkg/inbox/internal/pgmigrate")
	require.Equal(t, slices.Sorted(maps.Keys(outbox)), slices.Sorted(maps.Keys(inbox)),
		"pkg/outbox/internal/pgmigrate and pkg/inbox/internal/pgmigrate hold different files")
	for name, body := range outbox {
		require.Equal(t, body, inbox[name], "internal/pgmigrate/%s differs between pkg/outbox and pkg/inbox", name)
	}
}

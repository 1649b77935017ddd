package outbox

import (
	"flag"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite migrations/goose and migrations/golang-migrate from the templates (go generate)")

// TestToolMigrations fails when the files [Migrations] holds for goose and golang-migrate
// differ from what the templates render for the default Tables; go generate (this test with
// -update) writes them again.
func TestToolMigrations(t *testing.T) {
	t.Parallel()
	tmpl, err := templates()
	require.NoError(t, err)
	ms, err := renderMigrations(Tables{})
	require.NoError(t, err)
	want := tmpl.ToolFiles(ms)
	dirs := []string{"goose", "golang-migrate"}
	if *update {
		for _, dir := range dirs {
			require.NoError(t, os.RemoveAll(filepath.Join("migrations", dir)))
			require.NoError(t, os.MkdirAll(filepath.Join("migrations", dir), 0o755))
		}
		for name, b := range want {
			require.NoError(t, os.WriteFile(filepath.Join("migrations", name), b, 0o644))
		}
	}
	got := map[string][]byte{}
	for _, dir := range dirs {
		err := fs.WalkDir(os.DirFS("migrations"), dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			got[path], err = fs.ReadFile(os.DirFS("migrations"), path)
			return err
		})
		require.NoError(t, err)
	}
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)),
		"migrations/goose and migrations/golang-migrate hold other files than the templates make: run go generate")
	for name, b := range want {
		require.Equal(t, string(b), string(got[name]), "migrations/%s differs from what the templates render: run go generate", name)
	}
	// The embedded copy is what users get.
	for name, b := range want {
		embedded, err := fs.ReadFile(Migrations, "migrations/"+name)
		require.NoError(t, err)
		require.Equal(t, string(b), string(embedded), "embedded migrations/%s", name)
	}
}

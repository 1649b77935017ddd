package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// walkHeading is the README section whose first ```sh block is the saga walk, and walkFirst
// the block's first line: the addresses of the two APIs, which the test replaces with its own.
const (
	walkHeading = "### Walk the saga"
	walkFirst   = "O=http://localhost:8080 W=http://localhost:8090"
)

// TestReadmeWalk runs the README's saga walk, as pasted into bash, against a shop of its own:
// every command of it must work as printed, and its output must tell the story the comments
// tell. The walk waits on conditions with loops of its own; the test bounds them.
func TestReadmeWalk(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	_, err = exec.LookPath("curl")
	require.NoError(t, err, "the README's walk uses curl")
	script := readmeBlock(t, "../README.md", walkHeading)
	first, rest, ok := strings.Cut(script, "\n")
	require.True(t, ok)
	require.True(t, strings.HasPrefix(first, walkFirst), "the walk's first line names the two APIs: %q", first)

	s := startShop(t)
	script = "O=" + s.ordersURL + " W=" + s.stockURL + "\n" + rest

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-c", script)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	t.Logf("the walk's output:\n%s", out)
	require.NoError(t, ctx.Err(), "the walk did not finish in time")
	require.NoError(t, err)

	for _, want := range []string{
		`(?m)^HTTP/1.1 201 Created`,                       // the order placed
		`(?mi)^Idempotent-Replayed: true`,                 // and sent again
		`"status":"RESERVED"`,                             // reserved by the warehouse
		`"status":"CANCELLED"`,                            // then cancelled
		`(?m)^HTTP/1.1 200 OK\r?\n(?s:.*)"available":120`, // the restock with the ETag read
		`(?m)^HTTP/1.1 412 Precondition Failed`,           // the same ETag once more
		`\{"status":"ready"`,                              // both ready
	} {
		require.Regexp(t, regexp.MustCompile(want), string(out))
	}
	require.NotContains(t, string(out), "command not found")
}

// readmeBlock returns the first ```sh block after the line heading in the Markdown file path.
func readmeBlock(t *testing.T, path, heading string) string {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(src), "\n"+heading+"\n")
	require.True(t, ok, "%s has no section %q", path, heading)
	_, after, ok = strings.Cut(after, "```sh\n")
	require.True(t, ok, "%s: section %q has no ```sh block", path, heading)
	block, _, ok := strings.Cut(after, "\n```")
	require.True(t, ok, "%s: unterminated ```sh block", path)
	return block
}

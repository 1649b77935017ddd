// Package tools_test checks the repository's top-level documentation.
package tools_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRepoDocSnippets keeps the Go code of the repository's own Markdown (README.md, docs/,
// services/*/README.md) compiling: every ```go block must appear, line for line, in the body
// of an Example function of pkg/outbox or pkg/inbox, which their go vet and go test compile
// and run. The libraries' own documentation is checked by their TestDocSnippets.
func TestRepoDocSnippets(t *testing.T) {
	t.Parallel()
	var examples [][]string
	for _, lib := range []string{"../pkg/outbox", "../pkg/inbox"} {
		examples = append(examples, exampleBodies(t, lib)...)
	}
	require.NotEmpty(t, examples)
	files := []string{"../README.md"}
	for _, pattern := range []string{"../docs/*.md", "../services/*/README.md", "../services/*/*.md"} {
		m, err := filepath.Glob(pattern)
		require.NoError(t, err)
		files = append(files, m...)
	}
	slices.Sort(files)
	files = slices.Compact(files)
	var n int
	for _, file := range files {
		for _, s := range goBlocks(t, file) {
			n++
			t.Run(s.where, func(t *testing.T) {
				if !slices.ContainsFunc(examples, func(body []string) bool { return containsLines(body, s.lines) }) {
					t.Errorf("%s: this Go snippet is not the code of any Example function of pkg/outbox or pkg/inbox; copy it from one (or add one):\n%s",
						s.where, strings.Join(s.lines, "\n"))
				}
			})
		}
	}
	require.NotZero(t, n, "README.md has no ```go block: has this test lost track of it?")
}

// snippet is a block of Go code found in documentation.
type snippet struct {
	where string // file:line
	lines []string
}

// goBlocks returns the ```go blocks of the Markdown file path.
func goBlocks(t *testing.T, path string) []snippet {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []snippet
	var cur *snippet
	for i, line := range strings.Split(string(src), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{where: strings.TrimPrefix(path, "../") + ":" + strconv.Itoa(i+1)}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, strings.TrimRight(line, " \t"))
		}
	}
	require.Nil(t, cur, "%s: unterminated ```go block", path)
	return out
}

// exampleBodies returns the bodies of the Example functions in the test files under dir,
// one tab of indentation removed, as lines.
func exampleBodies(t *testing.T, dir string) [][]string {
	t.Helper()
	var out [][]string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") {
				continue
			}
			body := src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]
			var lines []string
			for line := range strings.SplitSeq(string(body), "\n") {
				lines = append(lines, strings.TrimRight(strings.TrimPrefix(line, "\t"), " \t"))
			}
			out = append(out, lines)
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// containsLines reports whether want, without its leading and trailing blank lines, occurs
// as consecutive lines of have.
func containsLines(have, want []string) bool {
	for len(want) > 0 && want[0] == "" {
		want = want[1:]
	}
	for len(want) > 0 && want[len(want)-1] == "" {
		want = want[:len(want)-1]
	}
	if len(want) == 0 {
		return false
	}
	for i := 0; i+len(want) <= len(have); i++ {
		if slices.Equal(have[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

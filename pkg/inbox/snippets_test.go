package inbox_test

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

// TestDocSnippets keeps the Go code in this module's documentation compiling: every ```go
// block of a Markdown file and every code block of a package comment must appear, line for
// line, in the body of an Example function of the module. go vet and go test compile those
// (and run the ones with an Output comment), so a snippet that no longer compiles, or that
// drifted from its example, fails here or there.
func TestDocSnippets(t *testing.T) {
	t.Parallel()
	examples := exampleBodies(t, ".")
	require.NotEmpty(t, examples)
	snippets := docSnippets(t, ".")
	require.NotEmpty(t, snippets)
	for _, s := range snippets {
		t.Run(s.where, func(t *testing.T) {
			if !slices.ContainsFunc(examples, func(body []string) bool { return containsLines(body, s.lines) }) {
				t.Errorf("%s: this Go snippet is not the code of any Example function; copy it from one (or add one):\n%s",
					s.where, strings.Join(s.lines, "\n"))
			}
		})
	}
}

// snippet is a block of Go code found in documentation.
type snippet struct {
	where string // file:line
	lines []string
}

// docSnippets returns the ```go blocks of the Markdown files under dir and the code blocks
// (tab-indented lines) of the package comments of its non-test Go files.
func docSnippets(t *testing.T, dir string) []snippet {
	t.Helper()
	var out []snippet
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var cur *snippet
			for i, line := range strings.Split(string(src), "\n") {
				switch {
				case cur == nil && strings.TrimSpace(line) == "```go":
					cur = &snippet{where: path + ":" + strconv.Itoa(i+1)}
				case cur != nil && strings.TrimSpace(line) == "```":
					out = append(out, *cur)
					cur = nil
				case cur != nil:
					cur.lines = append(cur.lines, strings.TrimRight(line, " \t"))
				}
			}
			require.Nil(t, cur, "%s: unterminated ```go block", path)
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			if f.Doc == nil {
				return nil
			}
			var cur *snippet
			flush := func() {
				if cur != nil {
					out = append(out, *cur)
					cur = nil
				}
			}
			for _, c := range f.Doc.List {
				text, ok := strings.CutPrefix(c.Text, "//\t")
				if !ok {
					flush()
					continue
				}
				if cur == nil {
					cur = &snippet{where: path + ":" + strconv.Itoa(fset.Position(c.Pos()).Line)}
				}
				cur.lines = append(cur.lines, strings.TrimRight(text, " \t"))
			}
			flush()
		}
		return nil
	})
	require.NoError(t, err)
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

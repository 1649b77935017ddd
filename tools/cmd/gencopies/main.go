// Command gencopies writes the generated copies of the repository's shared code (the
// libraries' internal/testinfra, internal/retry, internal/pgmigrate and the inbox's
// snippets_test.go) from their sources, as the manifest copies.Sets lists them, and removes
// what a copy directory holds that its source does not make. See package
// github.com/outboxshop/outboxshop/tools/copies.
//
//	gencopies [-root path/to/repository]
//
// Without -root it works on the repository it is run in: the nearest directory upwards
// holding go.work. go generate runs it from the sources' generate.go files; from the root,
// go run ./tools/cmd/gencopies does the same.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxshop/outboxshop/tools/copies"
)

func main() {
	root := flag.String("root", "", "the repository's root directory (default: the nearest one upwards holding go.work)")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "gencopies:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			return err
		}
	}
	return copies.Write(root, copies.Sets)
}

// findRoot returns the nearest directory, from the working directory upwards, that holds
// go.work.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("look for go.work: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work in the working directory or above it; pass -root")
		}
		dir = parent
	}
}

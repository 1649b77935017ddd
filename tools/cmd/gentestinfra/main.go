// Command gentestinfra writes the libraries' copies of internal/testinfra
// (pkg/outbox/internal/testinfra, pkg/inbox/internal/testinfra) from the source. It is run by
// go generate ./internal/testinfra. See package
// github.com/outboxshop/outboxshop/tools/testinfracopy.
//
//	gentestinfra [-root path/to/repository]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/outboxshop/outboxshop/tools/testinfracopy"
)

func main() {
	root := flag.String("root", ".", "the repository's root directory")
	flag.Parse()
	if err := testinfracopy.Write(*root); err != nil {
		fmt.Fprintln(os.Stderr, "gentestinfra:", err)
		os.Exit(1)
	}
}

// Command observe is `make observe`: Prometheus and Alertmanager, from the distribution's
// packages, on a configuration generated for the shop on this machine (package
// github.com/outboxshop/outboxshop/deploy/observe, docs/observe.md). Run from the repository
// root:
//
//	observe [-layout all|roles] [-dir .observe] [-deploy deploy] [-alertlog path] [-generate]
//
// -generate writes the configuration and exits. SIGINT (Ctrl-C) and SIGTERM stop the servers
// and exit 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxshop/outboxshop/deploy/observe"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "observe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("observe", flag.ContinueOnError)
	layout := fs.String("layout", string(observe.LayoutAll), "how the shop runs: all (make run, one process per service) or roles (one process per role)")
	dir := fs.String("dir", ".observe", "scratch folder: configuration, data and logs")
	deploy := fs.String("deploy", "deploy", "the repository's deploy folder")
	alertLog := fs.String("alertlog", "", "the alertlog executable (tools/cmd/alertlog) that prints Alertmanager's notifications; empty: none")
	generate := fs.Bool("generate", false, "write the configuration and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := observe.ParseLayout(*layout)
	if err != nil {
		return err
	}
	opts := observe.Options{Deploy: *deploy, Dir: *dir, Layout: l}
	if *generate {
		return observe.Generate(opts)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return observe.Run(ctx, observe.Config{Options: opts, AlertLog: *alertLog})
}

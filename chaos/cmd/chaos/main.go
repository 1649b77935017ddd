// Command chaos breaks the running shop on purpose — kills a relay, a consumer, the orders
// API, the broker or the orders database at the points where they can fail, cuts and slows
// the network, publishes poison, writes bad rows into the outbox, deploys every process
// again, raises the broker's memory alarm, freezes a relay, keeps the warehouse's database
// away — while orders flow, and proves from both databases that nothing acknowledged was lost
// and nothing was applied twice.
//
//	chaos run <scenario>|all [-target local|compose] [-rate 40] [-load 8s] [-v] [-keep]
//	chaos list
//
// It prints a line per phase while it works and ends with a Markdown table; the exit status
// is 1 when a scenario failed. See chaos/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/outboxshop/outboxshop/chaos"
)

const usage = `usage:
  chaos run <scenario>|all [flags]   run one scenario, several (a,b,c) or all of them
  chaos list                         list the scenarios

flags of run:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command and returns the exit status: 0 all passed, 1 a scenario failed or
// the run broke, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "local", "where the shop runs: local (private PostgreSQL and RabbitMQ, service processes) or compose (docker compose)")
	rate := fs.Float64("rate", 40, "orders per second during the load")
	load := fs.Duration("load", 8*time.Second, "how long orders are placed")
	drain := fs.Duration("drain", 90*time.Second, "how long to wait, after the load, for every invariant to hold")
	verbose := fs.Bool("v", false, "show the load generator's progress and every scenario's details")
	keep := fs.Bool("keep", false, "local: keep the run directory (binaries, data, logs) after the run")
	repo := fs.String("repo", "", "the repository root (default: found from the working directory)")
	composeFile := fs.String("compose-file", "", "compose: the compose file (default: docker-compose.yml in the repository root)")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nscenarios: %v\n", chaos.Names())
	}

	if len(args) == 0 {
		fs.Usage()
		return 2
	}
	switch args[0] {
	case "list":
		for _, s := range chaos.Scenarios() {
			fmt.Fprintf(stdout, "%-24s %s\n", s.Name, s.Summary)
		}
		return 0
	case "help", "-h", "-help", "--help":
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	case "run":
	default:
		fmt.Fprintf(stderr, "chaos: unknown command %q\n\n", args[0])
		fs.Usage()
		return 2
	}
	// Flags may come before or after the scenario name.
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "chaos run: name a scenario, or all")
		return 2
	}
	name := rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos run: unexpected arguments %v\n", fs.Args())
		return 2
	}
	scenarios, err := chaos.Select(name)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}

	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var t chaos.Target
	switch *target {
	case "local":
		local := chaos.NewLocal(chaos.LocalConfig{RepoDir: *repo, Keep: *keep, Logger: log})
		if *keep {
			defer func() { fmt.Fprintln(stderr, "chaos: run directory kept:", local.RunDir()) }()
		}
		t = local
	case "compose":
		t = chaos.NewCompose(chaos.ComposeConfig{File: *composeFile})
	default:
		fmt.Fprintf(stderr, "chaos: unknown target %q (local or compose)\n", *target)
		return 2
	}

	start := time.Now()
	outcomes, err := chaos.Run(ctx, scenarios, chaos.Options{
		Target: t, Rate: *rate, Load: *load, DrainTimeout: *drain, Progress: stderr, Verbose: *verbose, Logger: log,
	})
	if len(outcomes) > 0 {
		fmt.Fprintf(stdout, "\n%s\n", chaos.Table(outcomes))
		// With -v the details of every scenario follow the table; without it, Run printed
		// those of a failed scenario on stderr as it ended.
		if *verbose {
			fmt.Fprint(stdout, chaos.Details(outcomes))
		}
	}
	failed := 0
	interrupted := errors.Is(err, context.Canceled)
	for _, o := range outcomes {
		if !o.Passed() {
			failed++
			if interrupted {
				continue
			}
			for _, svc := range slices.Sorted(maps.Keys(o.Logs)) {
				fmt.Fprintf(stderr, "\n--- %s: last lines of %s ---\n%s\n", o.Scenario, svc, o.Logs[svc])
			}
		}
	}
	fmt.Fprintf(stdout, "chaos: target %s, %.0f orders/s, %s in all\n", t.Name(), *rate, time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(stdout, "%d passed, %d failed\n", len(outcomes)-failed, failed)
	switch {
	case interrupted:
		fmt.Fprintln(stderr, "chaos: interrupted; everything it started is stopped")
		return 1
	case err != nil:
		fmt.Fprintln(stderr, "chaos:", err)
		return 1
	case failed > 0:
		return 1
	}
	return 0
}

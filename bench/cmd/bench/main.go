// Command bench measures the outbox relay's throughput and latency against the raw limits
// of RabbitMQ and PostgreSQL and against Watermill's forwarder, and the inbox consumer's
// drain against RabbitMQ's consume limit, in one run, and prints one Markdown table (see
// docs/benchmarks.md).
//
//	go run ./bench/cmd/bench            # the full table (make bench), over 35 minutes on 2 cores
//	go run ./bench/cmd/bench -quick     # small sizes, to check the harness
//
// It needs a PostgreSQL server on which it may create databases and a RabbitMQ broker;
// everything it creates is named after a random run id and removed at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/outboxshop/outboxshop/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	pg := fs.String("postgres", envOr("OUTBOXSHOP_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL server on which the run creates and drops its databases (default: $OUTBOXSHOP_TEST_POSTGRES_URL, else local)")
	amqpURL := fs.String("amqp", envOr("OUTBOXSHOP_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		"RabbitMQ broker (default: $OUTBOXSHOP_TEST_AMQP_URL, else local)")
	quick := fs.Bool("quick", false, "small sizes (10k-row backlogs, 3 s per rate): checks the harness in about two minutes")
	phases := fs.String("phases", "", "comma-separated phases to run (default all): "+strings.Join(bench.AllPhases, ","))
	batch := fs.Int("batch", 0, "relay batch size (default: pkg/outbox's, 100)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the relay drain phase to this file")
	relayBin := fs.String("relay-binary", "", "relay program of the memory phase (default: go build ./bench/cmd/relay)")
	rates := fs.String("rates", "", "comma-separated orders/s of the latency phase; max is limit B with 16 writers, from the limits phase (default: 100,300,max; -quick: 200)")
	relays := fs.String("relays", "", "comma-separated relay counts of the pipelined relay's drains (default: 1,2)")
	serial := fs.String("serial-relays", "", "comma-separated relay counts of the serial relay's drains, one batch in flight (default: 1; none: 0)")
	inflight := fs.Int("inflight", 0, "batches in flight of the pipelined relay's drains (default: 2)")
	verbose := fs.Bool("v", false, "log the libraries' warnings and errors to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizes := bench.FullSizes()
	if *quick {
		sizes = bench.QuickSizes()
	}
	var err error
	if *rates != "" {
		if sizes.Rates, err = rateList(*rates); err != nil {
			return err
		}
	}
	if *relays != "" {
		if sizes.Relays, err = positiveInts("-relays", *relays); err != nil {
			return err
		}
	}
	switch *serial {
	case "":
	case "0":
		sizes.SerialRelays = nil
	default:
		if sizes.SerialRelays, err = positiveInts("-serial-relays", *serial); err != nil {
			return err
		}
	}
	cfg := bench.Config{
		PostgresURL: *pg, AMQPURL: *amqpURL, Sizes: sizes, Quick: *quick,
		BatchSize: *batch, InFlight: *inflight, CPUProfile: *cpuprofile, RelayBinary: *relayBin,
		Command:  strings.Join(append([]string{"go run ./bench/cmd/bench"}, args...), " "),
		Progress: os.Stderr,
	}
	if *phases != "" {
		cfg.Phases = strings.Split(*phases, ",")
	}
	if *verbose {
		cfg.Logger = bench.StderrLogger()
	}
	return bench.Run(ctx, cfg, os.Stdout)
}

// positiveInts parses a comma-separated list of positive numbers.
func positiveInts(flag, list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive number", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// rateList parses the -rates list: positive numbers, and max for [bench.CeilingRate].
func rateList(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == "max" {
			out = append(out, bench.CeilingRate)
			continue
		}
		n, err := positiveInts("-rates", f)
		if err != nil {
			return nil, err
		}
		out = append(out, n...)
	}
	return out, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Command loadgen places orders on the outboxshop orders API at a steady rate, prints a live
// progress line and ends with a summary. See loadgen/README.md.
//
//	loadgen -rate 50 -duration 10s
//
// Every flag can also be set by an environment variable, LOADGEN_ and the flag's name in upper
// case with - as _ (LOADGEN_RATE, LOADGEN_UNKNOWN_SKU…; -url is LOADGEN_ORDERS_URL); a flag
// on the command line wins. SIGINT or SIGTERM stops placing orders, waits for those in flight
// (at most the request timeout, 10s) and prints the summary; a second signal quits at once.
//
// Exit status: 0 when the run ended, whatever the shop answered; 1 when a duplicate was not
// answered with a replay of its first answer (an error of kind "mismatch": a correctness bug
// of the shop); 2 for bad flags or environment variables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxshop/outboxshop/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal gets the default behaviour: the process ends at once
	}()
	os.Exit(Main(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK       = 0
	exitMismatch = 1
	exitUsage    = 2
)

// Main runs the command with its arguments and environment and returns the exit status.
// Cancelling ctx is the signal: it stops the run, which still prints its summary.
func Main(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	opts, err := parse(args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") { // errors.Join: one problem a line
			fmt.Fprintf(stderr, "loadgen: %s\n", line)
		}
		return exitUsage
	}
	cfg := loadgen.Config{
		OrdersURL:          opts.url,
		Rate:               opts.rate,
		Concurrency:        opts.concurrency,
		Duration:           opts.duration,
		Count:              opts.count,
		CancelFraction:     opts.cancel,
		DuplicateFraction:  opts.duplicate,
		UnknownSKUFraction: opts.unknownSKU,
		RetryFor:           opts.retryFor,
		Seed:               opts.seed,
	}
	logTo := stderr
	if !opts.quiet {
		cfg.Progress = stderr
		if isTerminal(stderr) {
			logTo = clearLine{stderr} // a warning replaces the progress line, redrawn a second later
		}
		fmt.Fprintf(stderr, "loadgen: placing orders on %s: %s, concurrency %d, %s (Ctrl-C stops)\n",
			cfg.OrdersURL, describeRate(cfg.Rate), cfg.Concurrency, describeLimit(cfg.Duration, cfg.Count))
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitUsage
	}
	fmt.Fprint(stdout, res.Summary())
	if res.Errors["mismatch"] > 0 {
		return exitMismatch
	}
	return exitOK
}

// clearLine erases the terminal line before each write, where the progress line is.
type clearLine struct{ w io.Writer }

func (c clearLine) Write(p []byte) (int, error) {
	if _, err := io.WriteString(c.w, "\r\033[K"); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func describeRate(rate float64) string {
	if rate == 0 {
		return "as fast as the workers go"
	}
	return fmt.Sprintf("%g orders/s", rate)
}

func describeLimit(d time.Duration, count int) string {
	switch {
	case d > 0 && count > 0:
		return fmt.Sprintf("for %s or %d orders", d, count)
	case d > 0:
		return "for " + d.String()
	case count > 0:
		return fmt.Sprintf("%d orders", count)
	default:
		return "until stopped"
	}
}

type options struct {
	url                           string
	rate                          float64
	concurrency, count            int
	duration, retryFor            time.Duration
	cancel, duplicate, unknownSKU float64
	seed                          uint64
	quiet                         bool
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	if flagName == "url" {
		return "LOADGEN_ORDERS_URL"
	}
	return "LOADGEN_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse reads the flags, then the environment variables of the flags not given, and checks
// the values.
// Errors name what set the bad value: the flag or the variable.
func parse(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.url, "url", "http://127.0.0.1:8080", "the orders API")
	fs.Float64Var(&o.rate, "rate", 5, "orders per second, paced evenly; 0: as fast as -concurrency allows")
	fs.IntVar(&o.concurrency, "concurrency", 8, "orders in flight at most")
	fs.DurationVar(&o.duration, "duration", 0, "stop placing orders after this long; 0: no limit")
	fs.IntVar(&o.count, "count", 0, "stop after this many orders; 0: no limit (with -duration 0 too: until SIGINT/SIGTERM)")
	fs.Float64Var(&o.cancel, "cancel", 0.1, "share of acknowledged orders cancelled right after, 0 to 1")
	fs.Float64Var(&o.duplicate, "duplicate", 0.05, "share of orders sent twice with the same Idempotency-Key, 0 to 1")
	fs.Float64Var(&o.unknownSKU, "unknown-sku", 0.02, "share of orders with a SKU the shop does not sell (the API answers 422), 0 to 1")
	fs.DurationVar(&o.retryFor, "retry-for", 30*time.Second, "retry an order with the same Idempotency-Key after a connection error, timeout or 5xx for up to this long; 0: no retries")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the random choices, for a reproducible run; 0: random (printed in the summary)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line (the summary is still printed)")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + envName(f.Name) + ")" })
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: loadgen [flags]\n\nPlaces orders on the outboxshop orders API and prints a summary. "+
			"Every flag can be set by its environment variable; a flag wins.\n\n")
		fs.PrintDefaults()
	}

	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q (loadgen takes flags only)", fs.Arg(0))
	}
	source := map[string]string{} // flag name → what set it
	fs.Visit(func(f *flag.Flag) { source[f.Name] = "-" + f.Name })
	var envErrs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if _, onCommandLine := source[f.Name]; onCommandLine || !ok || v == "" {
			return // a flag wins; an empty variable is unset
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", name, v, err))
			return
		}
		source[f.Name] = name
	})
	if err := errors.Join(envErrs...); err != nil {
		return options{}, err
	}
	what := func(name string) string { return source[name] } // defaults are valid: a bad value was set by someone

	var errs []error
	check := func(ok bool, name, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s", what(name), fmt.Sprintf(format, args...)))
		}
	}
	u, err := url.Parse(o.url)
	check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "url",
		"must be an http:// or https:// URL, got %q", o.url)
	check(o.rate >= 0 && !math.IsInf(o.rate, 0), "rate", "must be zero or a positive number of orders per second, got %v", o.rate)
	check(o.concurrency >= 1, "concurrency", "must be at least 1, got %d", o.concurrency)
	check(o.duration >= 0, "duration", "must not be negative, got %s", o.duration)
	check(o.count >= 0, "count", "must not be negative, got %d", o.count)
	check(o.cancel >= 0 && o.cancel <= 1, "cancel", "must be a fraction between 0 and 1, got %v", o.cancel)
	check(o.duplicate >= 0 && o.duplicate <= 1, "duplicate", "must be a fraction between 0 and 1, got %v", o.duplicate)
	check(o.unknownSKU >= 0 && o.unknownSKU <= 1, "unknown-sku", "must be a fraction between 0 and 1, got %v", o.unknownSKU)
	check(o.retryFor >= 0, "retry-for", "must not be negative, got %s", o.retryFor)
	return o, errors.Join(errs...)
}

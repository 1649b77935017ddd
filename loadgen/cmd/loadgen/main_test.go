package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/loadgen/internal/fakeshop"
)

// envAsCommand makes the test binary run main() instead of the tests: TestSignal starts it
// as the loadgen command, configured by LOADGEN_* variables.
const envAsCommand = "LOADGEN_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(envAsCommand) == "1" {
		os.Args = os.Args[:1]
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// env is a fake environment.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestParse(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		o, err := parse(nil, env(nil), io.Discard)
		require.NoError(t, err)
		require.Equal(t, options{
			url: "http://127.0.0.1:8080", rate: 5, concurrency: 8, cancel: 0.1, duplicate: 0.05, unknownSKU: 0.02,
			retryFor: 30 * time.Second,
		}, o)
	})

	t.Run("EnvironmentThenFlags", func(t *testing.T) {
		t.Parallel()
		vars := map[string]string{
			"LOADGEN_ORDERS_URL": "http://orders:8080", "LOADGEN_RATE": "2.5", "LOADGEN_CONCURRENCY": "3",
			"LOADGEN_DURATION": "1m", "LOADGEN_COUNT": "100", "LOADGEN_CANCEL": "0.5", "LOADGEN_DUPLICATE": "0.25",
			"LOADGEN_UNKNOWN_SKU": "0", "LOADGEN_RETRY_FOR": "5s", "LOADGEN_SEED": "42", "LOADGEN_QUIET": "true",
		}
		o, err := parse(nil, env(vars), io.Discard)
		require.NoError(t, err)
		require.Equal(t, options{
			url: "http://orders:8080", rate: 2.5, concurrency: 3, duration: time.Minute, count: 100, cancel: 0.5,
			duplicate: 0.25, retryFor: 5 * time.Second, seed: 42, quiet: true,
		}, o)

		o, err = parse([]string{"-rate", "7", "-url", "http://localhost:1", "-quiet=false", "-unknown-sku", "0.5"}, env(vars), io.Discard)
		require.NoError(t, err)
		require.Equal(t, 7.0, o.rate, "a flag wins")
		require.Equal(t, "http://localhost:1", o.url)
		require.False(t, o.quiet)
		require.Equal(t, 0.5, o.unknownSKU)
		require.Equal(t, 3, o.concurrency, "the environment still counts for the other flags")
	})

	t.Run("EmptyVariableIsUnset", func(t *testing.T) {
		t.Parallel()
		o, err := parse(nil, env(map[string]string{"LOADGEN_RATE": ""}), io.Discard)
		require.NoError(t, err)
		require.Equal(t, 5.0, o.rate)
	})

	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"NegativeRate", []string{"-rate", "-1"}, nil, "-rate must be zero or a positive number of orders per second, got -1"},
		{"InfiniteRate", []string{"-rate", "+Inf"}, nil, "-rate must be zero"},
		{"NegativeRateFromEnv", nil, map[string]string{"LOADGEN_RATE": "-3"}, "LOADGEN_RATE must be zero"},
		{"RateNotANumber", nil, map[string]string{"LOADGEN_RATE": "fast"}, `LOADGEN_RATE="fast": parse error`},
		{"ZeroConcurrency", []string{"-concurrency", "0"}, nil, "-concurrency must be at least 1, got 0"},
		{"NegativeDuration", []string{"-duration", "-1s"}, nil, "-duration must not be negative"},
		{"BadDuration", []string{"-duration", "soon"}, nil, `invalid value "soon" for flag -duration`},
		{"NegativeCount", []string{"-count", "-1"}, nil, "-count must not be negative"},
		{"CancelAboveOne", []string{"-cancel", "1.5"}, nil, "-cancel must be a fraction between 0 and 1, got 1.5"},
		{"DuplicateNegative", []string{"-duplicate", "-0.1"}, nil, "-duplicate must be a fraction between 0 and 1"},
		{"UnknownSKUFromEnv", nil, map[string]string{"LOADGEN_UNKNOWN_SKU": "2"}, "LOADGEN_UNKNOWN_SKU must be a fraction between 0 and 1, got 2"},
		{"NegativeRetryFor", []string{"-retry-for", "-1s"}, nil, "-retry-for must not be negative"},
		{"NotHTTP", []string{"-url", "ftp://shop"}, nil, `-url must be an http:// or https:// URL, got "ftp://shop"`},
		{"URLFromEnv", nil, map[string]string{"LOADGEN_ORDERS_URL": "shop:8080"}, "LOADGEN_ORDERS_URL must be an http://"},
		{"BadSeed", nil, map[string]string{"LOADGEN_SEED": "-1"}, `LOADGEN_SEED="-1"`},
		{"Argument", []string{"now"}, nil, `unexpected argument "now"`},
		{"UnknownFlag", []string{"-speed", "3"}, nil, "flag provided but not defined: -speed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(tc.args, env(tc.vars), io.Discard)
			require.ErrorContains(t, err, tc.want)
		})
	}

	t.Run("EveryProblemAtOnce", func(t *testing.T) {
		t.Parallel()
		_, err := parse([]string{"-rate", "-1", "-cancel", "2"}, env(nil), io.Discard)
		require.ErrorContains(t, err, "-rate")
		require.ErrorContains(t, err, "-cancel")
	})

	t.Run("HelpNamesTheVariables", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		_, err := parse([]string{"-h"}, env(nil), &out)
		require.ErrorIs(t, err, flag.ErrHelp)
		for _, v := range []string{"LOADGEN_ORDERS_URL", "LOADGEN_RATE", "LOADGEN_UNKNOWN_SKU", "LOADGEN_RETRY_FOR", "LOADGEN_QUIET"} {
			require.Contains(t, out.String(), "(env "+v+")")
		}
	})
}

func TestMainCommand(t *testing.T) {
	t.Parallel()

	t.Run("Summary", func(t *testing.T) {
		t.Parallel()
		shop := fakeshop.New(t)
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), []string{"-url", shop.URL, "-count", "20", "-rate", "200", "-duplicate", "0.5", "-seed", "3"},
			env(nil), &stdout, &stderr)
		require.Equal(t, 0, code, stderr.String())
		require.Contains(t, stdout.String(), "loadgen: 20 orders placed in")
		require.Contains(t, stdout.String(), "seed          3 (")
		require.Contains(t, stderr.String(), "loadgen: placing orders on "+shop.URL+": 200 orders/s, concurrency 8, 20 orders")
		require.Contains(t, stderr.String(), "placed 20", "the progress line")
	})

	t.Run("Quiet", func(t *testing.T) {
		t.Parallel()
		shop := fakeshop.New(t)
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), []string{"-count", "3", "-quiet"}, env(map[string]string{"LOADGEN_ORDERS_URL": shop.URL}), &stdout, &stderr)
		require.Equal(t, 0, code)
		require.Empty(t, stderr.String())
		require.Contains(t, stdout.String(), "loadgen: 3 orders placed")
	})

	t.Run("ErrorsOtherThanMismatchExitZero", func(t *testing.T) {
		t.Parallel()
		shop := fakeshop.New(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
			return true
		})
		var stdout bytes.Buffer
		code := Main(context.Background(), []string{"-url", shop.URL, "-count", "2", "-retry-for", "0", "-quiet"}, env(nil), &stdout, io.Discard)
		require.Equal(t, 0, code)
		require.Contains(t, stdout.String(), "errors        2: http_5xx 2")
	})

	t.Run("MismatchExitsOne", func(t *testing.T) {
		t.Parallel()
		shop := fakeshop.New(t)
		shop.SetReplay(func(w http.ResponseWriter, stored fakeshop.Answer) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"a-second-order"}`))
		})
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), []string{"-url", shop.URL, "-count", "2", "-duplicate", "1", "-quiet"}, env(nil), &stdout, &stderr)
		require.Equal(t, 1, code)
		require.Contains(t, stdout.String(), "MISMATCH")
		require.Contains(t, stderr.String(), "request failed: mismatch", "logged as a warning")
	})

	t.Run("BadFlagExitsTwo", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		code := Main(context.Background(), []string{"-cancel", "7", "-rate", "-1"}, env(nil), io.Discard, &stderr)
		require.Equal(t, 2, code)
		require.Equal(t, "loadgen: -rate must be zero or a positive number of orders per second, got -1\n"+
			"loadgen: -cancel must be a fraction between 0 and 1, got 7\n", stderr.String())
	})

	t.Run("HelpExitsZero", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		require.Equal(t, 0, Main(context.Background(), []string{"-help"}, env(nil), io.Discard, &stderr))
		require.Contains(t, stderr.String(), "Usage: loadgen [flags]")
	})
}

// TestSignal runs the command in a process of its own, configured by the environment only,
// and stops it with SIGINT: it stops placing, prints the summary and exits 0.
func TestSignal(t *testing.T) {
	t.Parallel()
	shop := fakeshop.New(t)
	started := make(chan struct{})
	var once sync.Once
	var seen atomic.Int64
	shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
		if seen.Add(1) == 5 {
			once.Do(func() { close(started) })
		}
		return false
	})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envAsCommand+"=1", "LOADGEN_ORDERS_URL="+shop.URL, "LOADGEN_RATE=100", "LOADGEN_CANCEL=0.5",
		"LOADGEN_DUPLICATE=0", "LOADGEN_UNKNOWN_SKU=0") // one POST per order
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	select {
	case <-started:
	case err := <-exited:
		t.Fatalf("loadgen exited before it was stopped: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("loadgen placed no orders")
	}
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("loadgen exited %d:\n%s", exit.ExitCode(), stderr.String())
		}
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("loadgen did not stop after SIGINT")
	}
	require.Contains(t, stdout.String(), "orders placed in")
	require.Contains(t, stdout.String(), "errors        none")
	require.Contains(t, stderr.String(), "placed ", "the progress line")
	require.Len(t, shop.Orders(), int(seen.Load()), "every order in flight finished")
}

func TestClearLine(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := clearLine{&out}.Write([]byte("time=… level=WARN msg=x\n"))
	require.NoError(t, err)
	require.Equal(t, "\r\033[Ktime=… level=WARN msg=x\n", out.String())
	require.False(t, isTerminal(&out))
}

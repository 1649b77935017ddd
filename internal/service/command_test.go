package service_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/service"
)

// testConfig is the configuration of testCommand: SHOP_LOG_LEVEL, SHOP_FAIL.
type testConfig struct{ logLevel, fail string }

// runner is an app that returns err from Run.
type runner struct{ err error }

func (r runner) Run(context.Context) error { return r.err }

// testCommand is a service's command line whose app and subcommands record what they got.
func testCommand(got *[]string) service.Command[testConfig] {
	return service.Command[testConfig]{
		Name:  "shop",
		Usage: "usage: shop <command>\n",
		Load: func(environ map[string]string) (testConfig, error) {
			if environ["SHOP_BAD"] != "" {
				return testConfig{}, errors.New("SHOP_BAD is set")
			}
			return testConfig{logLevel: cmp.Or(environ["SHOP_LOG_LEVEL"], "info"), fail: environ["SHOP_FAIL"]}, nil
		},
		Settings: func(c testConfig) service.Settings {
			return service.Settings{LogFormat: "text", LogLevel: c.logLevel}
		},
		New: func(c testConfig, mode string, opts service.Options) (service.Runner, error) {
			*got = append(*got, fmt.Sprintf("new %s failpoints=%v", mode, opts.Failpoints.Armed()))
			switch c.fail {
			case "new":
				return nil, errors.New("cannot build")
			case "run":
				return runner{errors.New("component failed")}, nil
			}
			return runner{context.Canceled}, nil
		},
		Migrate: func(ctx context.Context, c testConfig, log *slog.Logger) error {
			*got = append(*got, "migrate")
			if c.fail == "migrate" {
				return errors.New("cannot migrate")
			}
			return nil
		},
		Commands: map[string]service.Subcommand[testConfig]{
			"count": func(ctx context.Context, c testConfig, args []string, out service.Output) int {
				*got = append(*got, "count "+strings.Join(args, " "))
				fmt.Fprintln(out.Stdout, "counted")
				return out.Exit(ctx, nil)
			},
		},
	}
}

func TestCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		args           []string
		env            map[string]string
		code           int
		got            []string
		stdout, stderr string // each |-separated part must be in the output
	}{
		{name: "no command is a usage error", code: 2, stderr: "usage: shop"},
		{name: "help prints the usage", args: []string{"--help"}, code: 0, stdout: "usage: shop"},
		{name: "an unknown command is a usage error", args: []string{"dance"}, code: 2, stderr: "shop: unknown command \"dance\"\n\nusage: shop"},
		{name: "a built-in command takes no arguments", args: []string{"migrate", "now"}, code: 2, stderr: `shop migrate: takes no arguments, got ["now"]`},
		{name: "a configuration error is on stderr", args: []string{"api"}, env: map[string]string{"SHOP_BAD": "1"}, code: 1, stderr: "shop: SHOP_BAD is set"},
		{name: "a bad log level is on stderr", args: []string{"api"}, env: map[string]string{"SHOP_LOG_LEVEL": "loud"}, code: 1, stderr: "loud"},
		{name: "serve runs the app in mode api", args: []string{"serve"}, code: 0, got: []string{"new api failpoints=[]"}},
		{name: "relay runs the app in mode relay", args: []string{"relay"}, code: 0, got: []string{"new relay failpoints=[]"}},
		{name: "all arms the crash points", args: []string{"all"}, env: map[string]string{"CHAOS_FAILPOINTS": "relay.after-publish=kill@3"},
			code: 0, got: []string{"new all failpoints=[relay.after-publish=kill@3]"}},
		{name: "bad crash points are logged", args: []string{"api"}, env: map[string]string{"CHAOS_FAILPOINTS": "x=boom"},
			code: 1, stdout: `msg="shop failed"|command=api|error="CHAOS_FAILPOINTS: failpoint`},
		{name: "an app that cannot be built is logged", args: []string{"api"}, env: map[string]string{"SHOP_FAIL": "new"},
			code: 1, got: []string{"new api failpoints=[]"}, stdout: `msg="shop failed"|command=api|error="cannot build"`},
		{name: "a failed app is logged", args: []string{"all"}, env: map[string]string{"SHOP_FAIL": "run"},
			code: 1, got: []string{"new all failpoints=[]"}, stdout: `error="component failed"`},
		{name: "migrate", args: []string{"migrate"}, code: 0, got: []string{"migrate"}},
		{name: "a failed migrate is logged", args: []string{"migrate"}, env: map[string]string{"SHOP_FAIL": "migrate"},
			code: 1, got: []string{"migrate"}, stdout: `msg="shop failed"|command=migrate|error="cannot migrate"`},
		{name: "the service's own command gets its arguments", args: []string{"count", "--to", "3"}, code: 0,
			got: []string{"count --to 3"}, stdout: "counted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				got            []string
				stdout, stderr bytes.Buffer
			)
			code := testCommand(&got).Run(context.Background(), tc.args, tc.env, &stdout, &stderr)
			require.Equal(t, tc.code, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
			require.Equal(t, tc.got, got)
			for _, want := range strings.Split(tc.stdout, "|") {
				require.Contains(t, stdout.String(), want)
			}
			require.Contains(t, stderr.String(), tc.stderr)
		})
	}
}

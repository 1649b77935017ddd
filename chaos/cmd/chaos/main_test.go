package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	call := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		code, out, _ := call("list")
		require.Equal(t, 0, code)
		require.Contains(t, out, "relay-after-publish")
		require.Contains(t, out, "api-after-commit")
	})

	t.Run("Help", func(t *testing.T) {
		t.Parallel()
		code, out, _ := call("help")
		require.Equal(t, 0, code)
		require.Contains(t, out, "-rate")
	})

	t.Run("BadUsage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{},
			{"explode"},
			{"run"},
			{"run", "no-such-scenario"},
			{"run", "all", "extra"},
			{"run", "all", "-target", "kubernetes"},
			{"run", "all", "-rate", "fast"},
		} {
			code, _, stderr := call(args...)
			require.Equal(t, 2, code, "%v: %s", args, stderr)
		}
	})

	t.Run("FlagsAfterTheName", func(t *testing.T) {
		t.Parallel()
		// An unknown target is refused after the flags were parsed: both positions work.
		code, _, stderr := call("run", "poison", "-rate", "10", "-target", "nowhere")
		require.Equal(t, 2, code)
		require.Contains(t, stderr, `unknown target "nowhere"`)
		code, _, stderr = call("run", "-target", "nowhere", "poison")
		require.Equal(t, 2, code)
		require.Contains(t, stderr, `unknown target "nowhere"`)
	})
}

package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunArguments(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args    []string
		wantErr string
	}{
		"NoCommand":      {nil, "want exactly one command"},
		"TwoCommands":    {[]string{"api", "relay"}, "want exactly one command"},
		"UnknownCommand": {[]string{"deploy"}, `unknown command "deploy"`},
		"Help":           {[]string{"help"}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := run(tc.args)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

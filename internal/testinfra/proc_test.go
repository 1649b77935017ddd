package testinfra_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	state, ppid, err := testinfra.ParseProcStat("4242 (postgres: walsender (x)) S 4200 4242 4242 0 -1 4194560")
	require.NoError(t, err)
	require.Equal(t, byte('S'), state)
	require.Equal(t, 4200, ppid)
	state, _, err = testinfra.ParseProcStat("7 (z) Z 1 7 7")
	require.NoError(t, err)
	require.Equal(t, byte('Z'), state)
	_, _, err = testinfra.ParseProcStat("no parentheses")
	require.Error(t, err)
	_, _, err = testinfra.ParseProcStat("1 (x) S")
	require.Error(t, err)

	t.Run("ThisMachine", func(t *testing.T) {
		t.Parallel()
		require.False(t, testinfra.ProcessGone(1), "init is there")
		require.True(t, testinfra.ProcessGone(1<<30), "no such pid")
		require.Empty(t, testinfra.ChildProcesses(1<<30))
	})
}

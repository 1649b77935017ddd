package testinfra

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	lo, hi := ephemeralPorts()
	require.Less(t, lo, hi)
	for range 20 {
		port, err := FreePort()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, minPrivatePort)
		require.Less(t, port, lo, "outgoing connections cannot take it between the check and the bind")
	}
}

func TestFreePortNeverGivesAPortTwice(t *testing.T) {
	t.Parallel()
	// Nothing listens on the ports it returns, so only its memory keeps them apart: 2,000
	// picks from the ~12,000 ports below the ephemeral range meet one another ~150 times
	// without it.
	seen := map[int]bool{}
	for range 2000 {
		port, err := FreePort()
		require.NoError(t, err)
		require.False(t, seen[port], "port %d given twice", port)
		seen[port] = true
	}
}

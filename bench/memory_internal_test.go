package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseVmHWM(t *testing.T) {
	t.Parallel()

	t.Run("Found", func(t *testing.T) {
		t.Parallel()
		status := "Name:\trelay\nVmPeak:\t 1263408 kB\nVmHWM:\t   23412 kB\nVmRSS:\t   20000 kB\n"
		got, err := parseVmHWM([]byte(status))
		require.NoError(t, err)
		require.Equal(t, int64(23412*1024), got)
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		_, err := parseVmHWM([]byte("Name:\tzombie\nState:\tZ (zombie)\n"))
		require.ErrorContains(t, err, "no VmHWM")
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		_, err := parseVmHWM([]byte("VmHWM:\t 12 MB\n"))
		require.ErrorContains(t, err, "unexpected VmHWM line")
	})
}

package bench

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func TestSetInFlight(t *testing.T) {
	t.Parallel()
	var cfg outbox.Config
	f := reflect.ValueOf(&cfg).Elem().FieldByName(inFlightField)
	if !f.IsValid() {
		require.NoError(t, setInFlight(&cfg, 1), "the serial relay is pkg/outbox's relay without the field")
		require.ErrorContains(t, setInFlight(&cfg, 2), "no Config.InFlightBatches")
		return
	}
	require.NoError(t, setInFlight(&cfg, 1))
	require.EqualValues(t, 1, f.Int())
	require.NoError(t, setInFlight(&cfg, 3))
	require.EqualValues(t, 3, f.Int())
}

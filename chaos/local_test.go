package chaos

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// TestSettingsAreReadByTheServices guards against a renamed variable: the services ignore
// variables they do not know, so a stale name would silently run a shop on the defaults
// (the machine's own PostgreSQL and RabbitMQ).
func TestSettingsAreReadByTheServices(t *testing.T) {
	t.Parallel()
	// Both services arm their crash points from one variable, read by the command line they
	// share (internal/service), not by their Configs.
	require.Equal(t, "CHAOS_FAILPOINTS", failpoint.EnvVar, "chaos arms the crash points through CHAOS_FAILPOINTS")
	for name, c := range map[string]struct {
		env   []string
		known map[string]bool
	}{
		"orders":    {ordersSettings("db", "amqp", "a:1", "a:2"), envNames(reflect.TypeFor[ordersapp.Config]())},
		"warehouse": {warehouseSettings("db", "amqp", "a:1", "a:2", "admin-token-of-the-test"), envNames(reflect.TypeFor[warehouseapp.Config]())},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, kv := range c.env {
				k, _, ok := strings.Cut(kv, "=")
				require.True(t, ok)
				require.True(t, c.known[k], "%s does not read %s", name, k)
			}
		})
	}
}

// TestStandbyNeedsAPair: without a shop whose orders database has a standby, the standby
// cannot be killed, restarted or promoted.
func TestStandbyNeedsAPair(t *testing.T) {
	t.Parallel()
	l := NewLocal(LocalConfig{})
	require.ErrorIs(t, l.Kill(t.Context(), OrdersDBStandby), ErrUnsupported)
	require.ErrorIs(t, l.Restart(t.Context(), OrdersDBStandby), ErrUnsupported)
	require.ErrorIs(t, l.Promote(t.Context(), OrdersDB), ErrUnsupported)
}

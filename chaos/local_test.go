package chaos

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/testinfra"
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
	ts := &tlsServers{files: testTLSFiles}
	for name, c := range map[string]struct {
		env   []string
		known map[string]bool
	}{
		"orders": {append(ordersSettings("db", "amqp", "a:1", "a:2"), ts.settings("ORDERS_")...),
			envNames(reflect.TypeFor[ordersapp.Config]())},
		"warehouse": {append(warehouseSettings("db", "amqp", "a:1", "a:2", "admin-token-of-the-test"), ts.settings("WAREHOUSE_")...),
			envNames(reflect.TypeFor[warehouseapp.Config]())},
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

var testTLSFiles = &testinfra.TLSFiles{CAFile: "/run/ca.pem", ClientCertFile: "/run/client.pem", ClientKeyFile: "/run/client.key"}

// TestTLSURLs: over TLS, a service gets URLs by the certificate's host name without the
// files, which it takes from its settings and refuses in a URL; the runner's own clients get
// the files in theirs.
func TestTLSURLs(t *testing.T) {
	t.Parallel()
	pg := &pgServer{port: 5000, tls: testTLSFiles}
	require.Equal(t, "postgres://postgres@localhost:5000/orders?sslmode=verify-full", pg.serviceURL("orders"))
	require.Equal(t, "postgres://postgres@localhost:5000/orders?sslmode=verify-full"+
		"&sslrootcert=%2Frun%2Fca.pem&sslcert=%2Frun%2Fclient.pem&sslkey=%2Frun%2Fclient.key", pg.URL("orders"))
	mq := &rabbitServer{port: 5001, tls: testTLSFiles}
	require.Equal(t, "amqps://guest:guest@localhost:5001/", mq.serviceURL())
	require.Equal(t, "amqps://guest:guest@localhost:5001/?cacertfile=%2Frun%2Fca.pem&certfile=%2Frun%2Fclient.pem&keyfile=%2Frun%2Fclient.key", mq.URL())

	// Without TLS, both are the URL of before.
	plain := &pgServer{port: 5000}
	require.Equal(t, "postgres://postgres@127.0.0.1:5000/orders?sslmode=disable", plain.serviceURL("orders"))
	require.Equal(t, plain.URL("orders"), plain.serviceURL("orders"))
	require.Equal(t, "amqp://guest:guest@127.0.0.1:5001/", (&rabbitServer{port: 5001}).serviceURL())
}

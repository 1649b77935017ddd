package service_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/service"
)

func TestListenHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := service.HTTPAddrs{API: "127.0.0.1:0", Ops: "127.0.0.1:0", Relay: "127.0.0.1:0"}

	t.Run("APIWithoutOpsAddr", func(t *testing.T) {
		t.Parallel()
		p := service.NewProcess("kit", "api", service.Options{})
		t.Cleanup(func() { require.NoError(t, p.Stop()) })
		ls, err := service.ListenHTTP(ctx, p, true, service.HTTPAddrs{API: addrs.API, Relay: addrs.Relay})
		require.NoError(t, err)
		require.NotEmpty(t, ls.APIAddr())
		require.Empty(t, ls.OpsAddr())
		require.Equal(t, httpapi.AllOps, ls.APIOps(), "the API's listener serves /metrics")
	})

	t.Run("APIWithOpsAddr", func(t *testing.T) {
		t.Parallel()
		p := service.NewProcess("kit", "api", service.Options{})
		t.Cleanup(func() { require.NoError(t, p.Stop()) })
		ls, err := service.ListenHTTP(ctx, p, true, addrs)
		require.NoError(t, err)
		require.NotEmpty(t, ls.APIAddr())
		require.NotEmpty(t, ls.OpsAddr())
		require.NotEqual(t, ls.APIAddr(), ls.OpsAddr())
		require.Equal(t, httpapi.ProbesOnly, ls.APIOps(), "/metrics on the operations listener alone")
	})

	t.Run("Relay", func(t *testing.T) {
		t.Parallel()
		p := service.NewProcess("kit", "relay", service.Options{})
		t.Cleanup(func() { require.NoError(t, p.Stop()) })
		ls, err := service.ListenHTTP(ctx, p, false, addrs)
		require.NoError(t, err)
		require.Empty(t, ls.APIAddr(), "a relay serves no API")
		require.NotEmpty(t, ls.OpsAddr())
	})

	t.Run("OpsPortTakenClosesTheAPIListener", func(t *testing.T) {
		t.Parallel()
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = taken.Close() })
		p := service.NewProcess("kit", "api", service.Options{})
		_, err = service.ListenHTTP(ctx, p, true, service.HTTPAddrs{API: "127.0.0.1:0", Ops: taken.Addr().String()})
		require.ErrorContains(t, err, "listen on "+taken.Addr().String())
		require.NoError(t, p.Stop(), "Stop closes the API's listener it bound")
	})
}

func TestCheckOpsAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		http, ops string
		want      string // "" when accepted
	}{
		{http: ":8080", ops: ""},
		{http: ":8080", ops: ":9090"},
		{http: "127.0.0.1:8080", ops: "10.0.0.1:8080"},
		{http: "127.0.0.1:0", ops: "127.0.0.1:0"},
		{http: ":8080", ops: ":8080", want: "ORDERS_OPS_ADDR (:8080) must differ from ORDERS_HTTP_ADDR (:8080)"},
		{http: ":8080", ops: "127.0.0.1:8080", want: "ORDERS_OPS_ADDR (127.0.0.1:8080) must differ from ORDERS_HTTP_ADDR (:8080)"},
		{http: "0.0.0.0:8080", ops: "[::1]:8080", want: "must differ from ORDERS_HTTP_ADDR"},
		{http: ":8080", ops: "9090", want: `ORDERS_OPS_ADDR must be host:port or :port, is "9090"`},
	} {
		var v envconfig.Checks
		service.CheckOpsAddr(&v, "ORDERS_", tc.http, tc.ops)
		if tc.want == "" {
			require.NoError(t, v.Err(), "%s beside %s", tc.ops, tc.http)
			continue
		}
		require.ErrorContains(t, v.Err(), tc.want, "%s beside %s", tc.ops, tc.http)
	}
}

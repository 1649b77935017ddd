package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	kit "github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// TestTLS runs the shop against a PostgreSQL server and a RabbitMQ node that take TLS alone
// and ask every client for a certificate of their private CA: every URL is amqps:// or says
// sslmode=verify-full, and the CA and the client certificate come from the settings
// (*_AMQP_CA_FILE, *_DATABASE_CA_FILE, *_CERT_FILE, *_KEY_FILE), never from the system's
// roots. Both services migrate (the migrate subcommand's path) and run, and an order goes
// through the saga. Then each wrong setting stops a start, within a bounded time, with an
// error that names it: a CA that did not sign the server's certificate, a host name the
// certificate does not name, no client certificate; and the settings that cannot work at
// all are refused before anything connects. The orders relay is the WAL relay, whose
// replication connection takes the same TLS as the pool.
func TestTLS(t *testing.T) {
	t.Parallel()
	files, db, node := testinfra.StartTLS(t, "-c", "wal_level=logical")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	exchange, dlx := testinfra.UniqueName(t, "events"), testinfra.UniqueName(t, "dlx")
	wcfg := warehouseapp.DefaultConfig()
	wcfg.DatabaseURL, wcfg.AMQPURL = db.TLSURL("warehouse"), node.URL
	wcfg.DatabaseCAFile, wcfg.DatabaseCertFile, wcfg.DatabaseKeyFile = files.CAFile, files.ClientCertFile, files.ClientKeyFile
	wcfg.AMQPCAFile, wcfg.AMQPCertFile, wcfg.AMQPKeyFile = files.CAFile, files.ClientCertFile, files.ClientKeyFile
	wcfg.HTTPAddr, wcfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	wcfg.EventsExchange, wcfg.DeadLetterExchange = exchange, dlx
	wcfg.Queue, wcfg.DeadLetterQueue = "warehouse", "warehouse.dead"
	wcfg.RelayPollInterval = 100 * time.Millisecond
	wcfg.AdminTokenFile = adminTokenFile

	ocfg := ordersapp.DefaultConfig()
	ocfg.DatabaseURL, ocfg.AMQPURL = db.TLSURL("orders"), node.URL
	ocfg.DatabaseCAFile, ocfg.DatabaseCertFile, ocfg.DatabaseKeyFile = files.CAFile, files.ClientCertFile, files.ClientKeyFile
	ocfg.AMQPCAFile, ocfg.AMQPCertFile, ocfg.AMQPKeyFile = files.CAFile, files.ClientCertFile, files.ClientKeyFile
	ocfg.HTTPAddr, ocfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	ocfg.EventsExchange, ocfg.DeadLetterExchange = exchange, dlx
	ocfg.Queue, ocfg.DeadLetterQueue = "orders", "orders.dead"
	ocfg.RelayPollInterval = 100 * time.Millisecond
	// The orders relay reads the transaction log: its replication connection goes over TLS
	// too, with the files the pool's URL got.
	ocfg.RelayMode = kit.RelayModeWAL

	t.Run("Saga", func(t *testing.T) {
		// The migrate subcommand's path creates each database over TLS.
		require.NoError(t, warehouseapp.Migrate(ctx, wcfg, nil))
		require.NoError(t, ordersapp.Migrate(ctx, ocfg, nil))
		warehouse, err := warehouseapp.New(wcfg, warehouseapp.ModeAll, warehouseapp.Options{})
		require.NoError(t, err)
		require.NoError(t, warehouse.Start(ctx))
		t.Cleanup(func() { require.NoError(t, warehouse.Stop()) })
		orders, err := ordersapp.New(ocfg, ordersapp.ModeAll, ordersapp.Options{})
		require.NoError(t, err)
		require.NoError(t, orders.Start(ctx))
		t.Cleanup(func() { require.NoError(t, orders.Stop()) })
		testinfra.Eventually(t, 30*time.Second, warehouse.Consuming, "warehouse consuming over TLS")

		code, _, _, err := call(http.MethodPut, "http://"+warehouse.HTTPAddr()+"/stock/BOOK-1", "", map[string]int64{"available": 5})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		code, _, created, err := call(http.MethodPost, orders.URL()+"/orders", "",
			orderRequest{CustomerID: "tls", Items: []orderLine{{SKU: "BOOK-1", Quantity: 2}}})
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, code)
		testinfra.Eventually(t, 30*time.Second, func() bool {
			_, _, got, err := call(http.MethodGet, orders.URL()+"/orders/"+created.ID, "", nil)
			return err == nil && got.Status == "RESERVED"
		}, "the order reserved: OrderCreated and StockReserved went through the TLS broker")
	})

	// Each start below must fail on its own: nothing retries a refused certificate.
	refused := func(t *testing.T, cfg ordersapp.Config, want ...string) {
		t.Helper()
		a, err := ordersapp.New(cfg, ordersapp.ModeAll, ordersapp.Options{})
		require.NoError(t, err)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = a.Start(sctx)
		require.Error(t, err)
		require.NoError(t, sctx.Err(), "the start failed on the certificate, without waiting for its deadline: %v", err)
		for _, w := range want {
			require.Contains(t, err.Error(), w)
		}
		require.NotContains(t, err.Error(), "guest:guest", "the error names settings, never a URL's credentials")
	}
	other := func(c ordersapp.Config, change func(*ordersapp.Config)) ordersapp.Config {
		change(&c)
		return c
	}
	t.Run("DatabaseOtherCA", func(t *testing.T) {
		refused(t, other(ocfg, func(c *ordersapp.Config) { c.DatabaseCAFile = files.OtherCAFile }),
			"ORDERS_DATABASE_CA_FILE", "certificate signed by unknown authority")
	})
	t.Run("DatabaseOtherHostName", func(t *testing.T) {
		refused(t, other(ocfg, func(c *ordersapp.Config) {
			c.DatabaseURL = strings.Replace(c.DatabaseURL, testinfra.TLSHost, "127.0.0.1", 1)
		}), "ORDERS_DATABASE_URL (127.0.0.1)", "doesn't contain any IP SANs")
	})
	t.Run("BrokerOtherCA", func(t *testing.T) {
		refused(t, other(ocfg, func(c *ordersapp.Config) { c.AMQPCAFile = files.OtherCAFile }),
			"ORDERS_AMQP_URL: URL 1 of 1", "ORDERS_AMQP_CA_FILE", "certificate signed by unknown authority")
	})
	t.Run("BrokerOtherHostName", func(t *testing.T) {
		refused(t, other(ocfg, func(c *ordersapp.Config) {
			c.AMQPURL = strings.Replace(c.AMQPURL, testinfra.TLSHost, "127.0.0.1", 1)
		}), "ORDERS_AMQP_URL: URL 1 of 1", `names "127.0.0.1"`, "doesn't contain any IP SANs")
	})
	t.Run("BrokerNoClientCertificate", func(t *testing.T) {
		refused(t, other(ocfg, func(c *ordersapp.Config) { c.AMQPCertFile, c.AMQPKeyFile = "", "" }),
			"ORDERS_AMQP_CERT_FILE", "client certificate")
	})
	t.Run("BrokerPortWithoutTLS", func(t *testing.T) {
		plain := strings.Replace(strings.Replace(testinfra.AMQPURL(t), "amqp://", "amqps://", 1), "127.0.0.1", testinfra.TLSHost, 1)
		refused(t, other(ocfg, func(c *ordersapp.Config) { c.AMQPURL = plain }), "ORDERS_AMQP_URL: URL 1 of 1", "check that the port takes TLS")
	})
	t.Run("SettingsThatCannotWork", func(t *testing.T) {
		for name, c := range map[string]struct {
			change func(*ordersapp.Config)
			want   string
		}{
			"PlainBrokerURL": {func(c *ordersapp.Config) { c.AMQPURL = "amqp://guest:guest@localhost:5672/" },
				"ORDERS_AMQP_URL: URL 1 of 1 is amqp://, and ORDERS_AMQP_CA_FILE, ORDERS_AMQP_CERT_FILE or ORDERS_AMQP_KEY_FILE is set: use amqps://"},
			"BrokerURLWithItsOwnFiles": {func(c *ordersapp.Config) { c.AMQPURL += "?cacertfile=/etc/ca.pem" },
				"ORDERS_AMQP_URL: URL 1 of 1 has TLS parameters"},
			"DatabaseNotVerifyFull": {func(c *ordersapp.Config) { c.DatabaseURL = strings.Replace(c.DatabaseURL, "verify-full", "require", 1) },
				"ORDERS_DATABASE_URL says sslmode=require, and ORDERS_DATABASE_CA_FILE, ORDERS_DATABASE_CERT_FILE or ORDERS_DATABASE_KEY_FILE is set: say sslmode=verify-full"},
			"DatabaseURLWithItsOwnCA": {func(c *ordersapp.Config) { c.DatabaseURL += "&sslrootcert=/etc/ca.pem" },
				"ORDERS_DATABASE_URL says sslrootcert"},
			"CAFileMissing":  {func(c *ordersapp.Config) { c.AMQPCAFile = "/nonexistent/ca.pem" }, "ORDERS_AMQP_CA_FILE: open /nonexistent/ca.pem"},
			"CAFileNotPEM":   {func(c *ordersapp.Config) { c.DatabaseCAFile = adminTokenFile }, "ORDERS_DATABASE_CA_FILE: " + adminTokenFile + " holds no PEM certificate"},
			"CertWithoutKey": {func(c *ordersapp.Config) { c.AMQPKeyFile = "" }, "ORDERS_AMQP_CERT_FILE is set without ORDERS_AMQP_KEY_FILE"},
			"KeyOfAnother": {func(c *ordersapp.Config) { c.DatabaseKeyFile = files.ServerKeyFile },
				"ORDERS_DATABASE_CERT_FILE and ORDERS_DATABASE_KEY_FILE: " + files.ClientCertFile + " and " + files.ServerKeyFile + " are not a certificate and its key"},
		} {
			t.Run(name, func(t *testing.T) {
				_, err := ordersapp.New(other(ocfg, c.change), ordersapp.ModeAll, ordersapp.Options{})
				require.ErrorContains(t, err, c.want)
				require.NotContains(t, err.Error(), "guest:guest")
				require.NotContains(t, err.Error(), "PRIVATE KEY", "a key file's content is never in an error")
			})
		}
	})
}

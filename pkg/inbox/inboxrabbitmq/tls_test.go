package inboxrabbitmq_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestTLS consumes from a RabbitMQ node that takes TLS alone, with a private CA and a client
// certificate given by Config.TLSClientConfig, into a PostgreSQL server that takes TLS
// alone (the pool's URL says sslmode=verify-full, the CA and the client certificate). A
// consumer that trusts another CA, or dials a name the certificate is not for, is never
// connected, and says why: the certificate, in its status's error.
func TestTLS(t *testing.T) {
	t.Parallel()
	files, db, node := testinfra.StartTLS(t)
	b := setupWith(t, db.TLSURL("postgres")+files.TLSFileParams(), node.URL)

	t.Run("Consumes", func(t *testing.T) {
		cfg := b.config(recordEffect)
		cfg.TLSClientConfig = files.ClientConfig(t)
		stop := b.run(t, cfg)
		defer stop()
		ids := []string{"tls-1", "tls-2", "tls-3", "tls-4", "tls-5"}
		for _, id := range ids {
			b.publish(t, jsonMessage(id))
		}
		testinfra.Eventually(t, 30*time.Second, func() bool {
			for _, id := range ids {
				if b.effects(t, id) != 1 {
					return false
				}
			}
			return true
		}, "every message applied once over TLS")
		require.Empty(t, cfg.TLSClientConfig.ServerName, "each connection got a clone of the config")
	})
	other := files.ClientConfig(t)
	other.RootCAs = x509.NewCertPool()
	otherCA, err := os.ReadFile(files.OtherCAFile)
	require.NoError(t, err)
	require.True(t, other.RootCAs.AppendCertsFromPEM(otherCA))
	for name, c := range map[string]struct {
		url  string
		tls  *tls.Config
		want func(error) bool
	}{
		"OtherCA": {node.URL, other,
			func(err error) bool { _, ok := errors.AsType[x509.UnknownAuthorityError](err); return ok }},
		"OtherHostName": {strings.Replace(node.URL, testinfra.TLSHost, "127.0.0.1", 1), files.ClientConfig(t),
			func(err error) bool { _, ok := errors.AsType[x509.HostnameError](err); return ok }},
	} {
		t.Run("Refuses"+name, func(t *testing.T) {
			cfg := b.config(recordEffect)
			cfg.URL, cfg.TLSClientConfig = c.url, c.tls
			consumer, stop := b.start(t, b.pool, cfg)
			defer stop()
			testinfra.Eventually(t, 30*time.Second, func() bool { return consumer.Status().LastError != nil }, "a failed connect")
			st := consumer.Status()
			require.False(t, st.Connected)
			require.Truef(t, c.want(st.LastError), "got %v", st.LastError)
		})
	}
}

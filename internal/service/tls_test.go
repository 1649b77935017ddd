package service_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/internal/tlsfiles"
)

// TestCheckBrokerTLS proves the start-up check of the broker's TLS settings against a node
// that takes TLS alone and asks for a client certificate: the right settings pass; another
// CA, another host name or no client certificate fail naming the settings; a broker that
// is not there passes (the consumer and the relay wait for it).
func TestCheckBrokerTLS(t *testing.T) {
	t.Parallel()
	files := testinfra.NewTLSFiles(t)
	node := testinfra.StartRabbitNodeTLS(t, files)
	ctx := context.Background()
	names := tlsfiles.NamesOf("ORDERS_AMQP_")
	good := tlsfiles.Files{CA: files.CAFile, Cert: files.ClientCertFile, Key: files.ClientKeyFile}
	config := func(f tlsfiles.Files) *tls.Config {
		c, err := f.Config(names)
		require.NoError(t, err)
		return c
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())

	require.NoError(t, service.CheckBrokerTLS(ctx, []string{node.URL}, config(good), 5*time.Second, "ORDERS_"))
	require.NoError(t, service.CheckBrokerTLS(ctx, []string{fmt.Sprintf("amqps://guest:guest@%s/", closed)}, config(good), 5*time.Second, "ORDERS_"),
		"a broker that is not there is an outage, not a setting")
	for name, c := range map[string]struct {
		urls  []string
		files tlsfiles.Files
		want  string
	}{
		"OtherCA":      {[]string{node.URL}, tlsfiles.Files{CA: files.OtherCAFile, Cert: files.ClientCertFile, Key: files.ClientKeyFile}, "unknown authority"},
		"OtherHost":    {[]string{strings.Replace(node.URL, testinfra.TLSHost, "127.0.0.1", 1)}, good, "IP SANs"},
		"NoClientCert": {[]string{node.URL}, tlsfiles.Files{CA: files.CAFile}, "client certificate"},
		"SecondOfTwo":  {[]string{fmt.Sprintf("amqps://guest:guest@%s/", closed), strings.Replace(node.URL, testinfra.TLSHost, "127.0.0.1", 1)}, good, "URL 2 of 2"},
	} {
		t.Run(name, func(t *testing.T) {
			err := service.CheckBrokerTLS(ctx, c.urls, config(c.files), 5*time.Second, "ORDERS_")
			require.ErrorContains(t, err, c.want)
			require.ErrorContains(t, err, "ORDERS_AMQP_CA_FILE")
			require.NotContains(t, err.Error(), "guest:guest")
		})
	}
}

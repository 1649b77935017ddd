package service_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
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

// fakeBroker is a TLS server that asks for a client certificate without requiring one, and
// hands each connection to serve (the n-th from 1) after the handshake: what a broker that
// restarts, or a load balancer that resets, looks like to the start-up check.
func fakeBroker(t *testing.T, f *testinfra.TLSFiles, serve func(n int, c net.Conn)) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(f.ServerCertFile, f.ServerKeyFile)
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.ReadFull(c, make([]byte, 8)); err != nil { // the handshake, the protocol header
					return
				}
				serve(n, c)
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "amqps://guest:guest@" + testinfra.TLSHost + ":" + port + "/"
}

// TestCheckBrokerTLSOutages: what ends a connection without a refusal is an outage, not a
// setting: a broker slow to answer (a timeout), one that resets a connection once and then
// answers; and a URL that names its own CA (cacertfile) without the settings is left to the
// library, which reads it.
func TestCheckBrokerTLSOutages(t *testing.T) {
	t.Parallel()
	files := testinfra.NewTLSFiles(t)
	conf, err := tlsfiles.Files{CA: files.CAFile}.Config(tlsfiles.NamesOf("ORDERS_AMQP_"))
	require.NoError(t, err)
	ctx := context.Background()

	answers := func(c net.Conn) { _, _ = c.Write([]byte{1}) } // a frame begins
	resetOnce := fakeBroker(t, files, func(n int, c net.Conn) {
		if n == 1 {
			_ = c.(*tls.Conn).NetConn().(*net.TCPConn).SetLinger(0) // a reset
			return
		}
		answers(c)
	})
	require.NoError(t, service.CheckBrokerTLS(ctx, []string{resetOnce}, conf, 5*time.Second, "ORDERS_"))

	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	slow := fakeBroker(t, files, func(int, net.Conn) { <-stop })
	for range 20 {
		require.NoError(t, service.CheckBrokerTLS(ctx, []string{slow}, conf, 30*time.Millisecond, "ORDERS_"),
			"a deadline that passed is never a refusal")
	}

	own := fakeBroker(t, files, func(_ int, c net.Conn) { answers(c) }) + "?cacertfile=" + files.CAFile
	tlsConf, err := service.BrokerTLS(ctx, service.BrokerEnv{AMQPURL: own}, "ORDERS_")
	require.NoError(t, err)
	require.Nil(t, tlsConf)
}

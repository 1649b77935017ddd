package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/internal/tlsfiles"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	files := testinfra.NewTLSFiles(t)
	names := tlsfiles.NamesOf("ORDERS_AMQP_")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))

	c, err := tlsfiles.Files{}.Config(names)
	require.NoError(t, err)
	require.Nil(t, c, "no file: the system's roots, no client certificate")

	c, err = tlsfiles.Files{CA: files.CAFile, Cert: files.ClientCertFile, Key: files.ClientKeyFile}.Config(names)
	require.NoError(t, err)
	require.NotNil(t, c.RootCAs)
	require.Len(t, c.Certificates, 1)
	require.Equal(t, uint16(tls.VersionTLS12), c.MinVersion)

	for name, tc := range map[string]struct {
		files tlsfiles.Files
		want  string
	}{
		"MissingCA":      {tlsfiles.Files{CA: "/nonexistent/ca.pem"}, "ORDERS_AMQP_CA_FILE: open /nonexistent/ca.pem"},
		"CAWithoutCerts": {tlsfiles.Files{CA: notPEM}, "ORDERS_AMQP_CA_FILE: " + notPEM + " holds no PEM certificate"},
		"KeyAsCA":        {tlsfiles.Files{CA: files.ClientKeyFile}, "holds no PEM certificate"},
		"CertAlone":      {tlsfiles.Files{Cert: files.ClientCertFile}, "ORDERS_AMQP_CERT_FILE is set without ORDERS_AMQP_KEY_FILE"},
		"KeyAlone":       {tlsfiles.Files{Key: files.ClientKeyFile}, "ORDERS_AMQP_KEY_FILE is set without ORDERS_AMQP_CERT_FILE"},
		"KeyOfAnother":   {tlsfiles.Files{Cert: files.ClientCertFile, Key: files.ServerKeyFile}, "are not a certificate and its key"},
		"Both":           {tlsfiles.Files{CA: notPEM, Cert: files.ClientCertFile}, "ORDERS_AMQP_CA_FILE"}, // every problem at once
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.files.Config(names)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "PRIVATE KEY", "never a key's content")
			require.NotContains(t, err.Error(), strings.Split(files.ClientKey, "\n")[1])
		})
	}
}

// TestRefused tells a handshake that failed on a certificate, or on a port without TLS,
// from an outage, on real connections.
func TestRefused(t *testing.T) {
	t.Parallel()
	files := testinfra.NewTLSFiles(t)
	serverCert, err := tls.LoadX509KeyPair(files.ServerCertFile, files.ServerKeyFile)
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverCert}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("AMQP\x00\x00\x09\x01"))
			_ = c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())

	good := files.ClientConfig(t)
	dial := func(addr, host string, c *tls.Config) error {
		c = c.Clone()
		c.ServerName = host
		conn, err := tls.Dial("tcp", addr, c)
		if err == nil {
			_ = conn.Close()
		}
		return err
	}
	require.NoError(t, dial(ln.Addr().String(), testinfra.TLSHost, good))
	other := good.Clone()
	other.RootCAs = x509.NewCertPool()
	for name, tc := range map[string]struct {
		err     error
		refused bool
	}{
		"OtherCA":      {dial(ln.Addr().String(), testinfra.TLSHost, other), true},
		"OtherHost":    {dial(ln.Addr().String(), "127.0.0.1", good), true},
		"PlainPort":    {dial(plain.Addr().String(), testinfra.TLSHost, good), true},
		"Closed":       {dial(closedAddr, testinfra.TLSHost, good), false},
		"Wrapped":      {fmt.Errorf("connect: %w", dial(ln.Addr().String(), testinfra.TLSHost, other)), true},
		"Nil":          {nil, false},
		"Other":        {errors.New("tls: something"), false},
		"RemoteAlert":  {&net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, true},
		"ReadTimedOut": {&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.refused, tlsfiles.Refused(tc.err), "%v", tc.err)
		})
	}
}

package testinfra

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestTLSServers proves the private TLS servers take what a verified client with a client
// certificate sends, and nothing else: no plain connection, no client without a certificate,
// and a client that trusts another CA or dials another host name fails on the certificate.
func TestTLSServers(t *testing.T) {
	t.Parallel()
	files := NewTLSFiles(t)
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		s := StartPostgresTLS(t, files)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.TLSURL("postgres")+files.TLSFileParams())
		if err != nil {
			t.Fatalf("verified client: %v", err)
		}
		var ssl bool
		if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
			t.Fatalf("pg_stat_ssl: ssl %v, %v", ssl, err)
		}
		_ = conn.Close(ctx)
		for name, u := range map[string]string{
			"plain":          s.URL("postgres"),
			"no client cert": s.TLSURL("postgres") + "&sslrootcert=" + files.CAFile,
		} {
			if conn, err := pgx.Connect(ctx, u); err == nil {
				_ = conn.Close(ctx)
				t.Errorf("%s: connected", name)
			}
		}
		_, err = pgx.Connect(ctx, strings.Replace(s.TLSURL("postgres"), TLSHost, "127.0.0.1", 1)+files.TLSFileParams())
		if _, ok := errors.AsType[x509.HostnameError](err); !ok {
			t.Errorf("wrong host: %v, want a host-name error", err)
		}
		_, err = pgx.Connect(ctx, s.TLSURL("postgres")+strings.Replace(files.TLSFileParams(), "ca.pem", "other-ca.pem", 1))
		if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
			t.Errorf("other CA: %v, want an unknown-authority error", err)
		}
	})
	t.Run("RabbitMQ", func(t *testing.T) {
		t.Parallel()
		n := StartRabbitNodeTLS(t, files)
		conn, err := amqp.DialTLS(n.URL, files.ClientConfig(t))
		if err != nil {
			t.Fatalf("verified client: %v", err)
		}
		_ = conn.Close()
		noCert := files.ClientConfig(t)
		noCert.Certificates = nil
		if conn, err := amqp.DialTLS(n.URL, noCert); err == nil {
			_ = conn.Close()
			t.Error("a client without a certificate connected")
		}
		if conn, err := amqp.Dial(strings.Replace(n.URL, "amqps", "amqp", 1)); err == nil {
			_ = conn.Close()
			t.Error("a plain client connected")
		}
		_, err = amqp.DialTLS(strings.Replace(n.URL, TLSHost, "127.0.0.1", 1), files.ClientConfig(t))
		if _, ok := errors.AsType[x509.HostnameError](err); !ok {
			t.Errorf("wrong host: %v, want a host-name error", err)
		}
		other := files.ClientConfig(t)
		other.RootCAs = x509.NewCertPool()
		otherCA, err := os.ReadFile(files.OtherCAFile)
		if err != nil || !other.RootCAs.AppendCertsFromPEM(otherCA) {
			t.Fatalf("other CA: %v", err)
		}
		_, err = amqp.DialTLS(n.URL, other)
		if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
			t.Errorf("other CA: %v, want an unknown-authority error", err)
		}
	})
}

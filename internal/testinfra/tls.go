package testinfra

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TLSHost is the one name the servers' certificates of [NewTLSFiles] are valid for. A client
// that dials them as 127.0.0.1 instead gets a host-name error: what a wrong host in a URL
// does.
const TLSHost = "localhost"

// TLSFiles are a test's private certificate authority and the certificates it signed, as
// PEM files in a directory of the test's own: what a TLS test gives its servers and its
// clients instead of the system's roots.
type TLSFiles struct {
	// CAFile is the CA's certificate: what a client trusts.
	CAFile string
	// ServerCertFile and ServerKeyFile are a server certificate for [TLSHost] alone.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate whose common name is
	// "postgres": PostgreSQL's cert authentication maps it to that user, and RabbitMQ's
	// verify_peer accepts it as signed by the CA.
	ClientCertFile, ClientKeyFile string
	// OtherCAFile is a CA that signed none of them: a client that trusts it instead of
	// CAFile must refuse the servers.
	OtherCAFile string
	// ClientKey is the client key's PEM: a secret a test can look for in what it captured.
	ClientKey string
}

// NewTLSFiles makes a certificate authority and a server and a client certificate signed by
// it, valid for an hour, in a temporary directory removed when the test ends.
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	f, err := newTLSFiles(t.TempDir())
	if err != nil {
		t.Fatalf("test certificates: %v", err)
	}
	return f
}

// WriteTLSFiles makes them as [NewTLSFiles] does, in dir, which the caller removes: for a
// program that runs servers over TLS outside a test (the chaos runner).
func WriteTLSFiles(dir string) (*TLSFiles, error) { return newTLSFiles(dir) }

func newTLSFiles(dir string) (*TLSFiles, error) {
	f := &TLSFiles{
		CAFile: filepath.Join(dir, "ca.pem"), OtherCAFile: filepath.Join(dir, "other-ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"), ServerKeyFile: filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.pem"), ClientKeyFile: filepath.Join(dir, "client.key"),
	}
	ca, caKey, _, err := newCertificate("outboxshop test CA", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	other, _, _, err := newCertificate("outboxshop other test CA", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	server, _, serverKey, err := newCertificate(TLSHost, []string{TLSHost}, ca, caKey)
	if err != nil {
		return nil, err
	}
	client, _, clientKey, err := newCertificate("postgres", nil, ca, caKey)
	if err != nil {
		return nil, err
	}
	f.ClientKey = string(clientKey)
	for path, content := range map[string][]byte{
		f.CAFile: certPEM(ca), f.OtherCAFile: certPEM(other),
		f.ServerCertFile: certPEM(server), f.ServerKeyFile: serverKey,
		f.ClientCertFile: certPEM(client), f.ClientKeyFile: clientKey,
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// ClientConfig is the tls.Config of a client that trusts the CA and shows the client
// certificate.
func (f *TLSFiles) ClientConfig(t testing.TB) *tls.Config {
	t.Helper()
	c, err := f.clientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *TLSFiles) clientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("no certificate in " + f.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// newCertificate makes an ECDSA key and a certificate for cn: a CA's, self-signed, when
// parent is nil; else a leaf signed by parent, for the DNS names hosts (a server) or for
// client authentication (no hosts). It returns the certificate, its key and the key's PEM.
func newCertificate(cn string, hosts []string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"outboxshop tests"}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     hosts,
	}
	signer, signerKey := tmpl, key
	switch {
	case parent == nil:
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	case len(hosts) > 0:
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		signer, signerKey = parent, parentKey
	default:
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	// SEC 1 ("EC PRIVATE KEY"): what OpenSSL, Erlang's ssl and Go all read.
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// copyOwned copies the files src to the directory dir under the names dst, readable by the
// server's user alone (PostgreSQL refuses a key that others can read).
func copyOwned(dir string, own func(string) error, files map[string]string) error {
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		p := filepath.Join(dir, dst)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
		if err := own(p); err != nil {
			return err
		}
	}
	return nil
}

// StartRabbitNodeTLS starts a private node, as [StartRabbitNode] does, that listens for
// AMQP over TLS alone (amqps://, no plain listener) with the server certificate of files,
// and asks for a client certificate signed by its CA (verify_peer; one without is refused).
// Its URL is amqps://guest:guest@localhost:port/: a client needs the CA of files, and a
// client certificate.
func StartRabbitNodeTLS(t testing.TB, files *TLSFiles, conf ...string) *RabbitNode {
	t.Helper()
	n, err := startRabbitNodeTLS(files, conf)
	if n != nil {
		t.Cleanup(n.stop)
	}
	if err != nil {
		if _, ok := errors.AsType[*missingError](err); ok {
			unavailable(t, "a private RabbitMQ node", err)
		}
		t.Fatalf("private RabbitMQ node with TLS: %v", err)
	}
	return n
}

func startRabbitNodeTLS(files *TLSFiles, conf []string) (*RabbitNode, error) {
	tlsConf, err := files.clientConfig()
	if err != nil {
		return nil, err
	}
	n, err := newRabbitNode(nil, "")
	if err != nil {
		return n, err
	}
	if err := copyOwned(n.dir, n.chown, map[string]string{
		"ca.pem": files.CAFile, "server.pem": files.ServerCertFile, "server.key": files.ServerKeyFile,
	}); err != nil {
		return n, err
	}
	n.tls = tlsConf
	n.URL = fmt.Sprintf("amqps://guest:guest@%s:%d/", TLSHost, n.port)
	tlsNodes.Store(n.URL, tlsConf)
	d := func(name string) string { return filepath.Join(n.dir, name) }
	conf = append([]string{
		"listeners.tcp = none",
		fmt.Sprintf("listeners.ssl.1 = 127.0.0.1:%d", n.port),
		"ssl_options.cacertfile = " + d("ca.pem"),
		"ssl_options.certfile = " + d("server.pem"),
		"ssl_options.keyfile = " + d("server.key"),
		"ssl_options.verify = verify_peer",
		"ssl_options.fail_if_no_peer_cert = true",
	}, conf...)
	if err := n.writeConfig(conf); err != nil {
		return n, err
	}
	if err := n.launch(); err != nil {
		return n, err
	}
	return n, n.waitReady(time.Now().Add(90 * time.Second))
}

// tlsNodes are the client TLS configs of the nodes of StartRabbitNodeTLS, by URL, for
// DialAMQP.
var tlsNodes sync.Map

// DialAMQP connects to the broker of amqpURL as the testinfra's own helpers do: with the
// CA and the client certificate of a node of [StartRabbitNodeTLS], else as amqp.Dial.
func DialAMQP(amqpURL string) (*amqp.Connection, error) {
	if c, ok := tlsNodes.Load(amqpURL); ok {
		return amqp.DialTLS(amqpURL, c.(*tls.Config).Clone())
	}
	return amqp.Dial(amqpURL)
}

// StartPostgresTLS starts a private PostgreSQL server alone (a [PostgresPair]'s primary
// without its standby, with the extra settings given) that takes connections over TLS alone,
// with the server certificate of files, and authenticates them by a client certificate
// signed by its CA whose common name is the user's (cert: "postgres", files' client
// certificate). [PostgresServer.TLSURL] is its URL. It is stopped and removed when the test
// ends.
func StartPostgresTLS(t testing.TB, files *TLSFiles, settings ...string) *PostgresServer {
	t.Helper()
	s, stop, err := startPostgresTLS(files, settings)
	t.Cleanup(stop)
	if err != nil {
		if _, ok := errors.AsType[*missingError](err); ok {
			unavailable(t, "a private PostgreSQL server", err)
		}
		t.Fatalf("private PostgreSQL server with TLS: %v", err)
	}
	return s
}

func startPostgresTLS(files *TLSFiles, settings []string) (*PostgresServer, func(), error) {
	s, stop, err := startServer(func(s *PostgresServer) ([]string, error) {
		// The files go into the data directory, owned by the server's user.
		err := copyOwned(s.data, s.pair.own, map[string]string{
			"ca.pem": files.CAFile, "server.pem": files.ServerCertFile, "server.key": files.ServerKeyFile,
		})
		return []string{"-c", "ssl=on", "-c", "ssl_ca_file=ca.pem", "-c", "ssl_cert_file=server.pem", "-c", "ssl_key_file=server.key"}, err
	}, settings...)
	if err != nil {
		return s, stop, err
	}
	// The server started with initdb's trust for every local connection, which start()
	// polled; from now on a TCP connection without TLS, or without a client certificate of
	// the CA, is refused. The socket keeps trust, for the tools.
	hba := "local all all trust\n" +
		"hostssl all all 127.0.0.1/32 cert\nhostssl all all ::1/128 cert\n" +
		"hostssl replication all 127.0.0.1/32 cert\nhostssl replication all ::1/128 cert\n"
	p := filepath.Join(s.data, "pg_hba.conf")
	if err := os.WriteFile(p, []byte(hba), 0o600); err != nil {
		return s, stop, err
	}
	if err := s.pair.own(p); err != nil {
		return s, stop, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := s.pair.run(ctx, "pg_ctl", "reload", "-D", s.data); err != nil {
		return s, stop, fmt.Errorf("pg_ctl reload: %w\n%s", err, out)
	}
	return s, stop, nil
}

// StartTLS makes the certificates of [NewTLSFiles] and starts, at once, a PostgreSQL
// server of [StartPostgresTLS] (with the extra settings given) and a RabbitMQ node of
// [StartRabbitNodeTLS] on them: what a test of a whole path over TLS needs.
func StartTLS(t testing.TB, pgSettings ...string) (*TLSFiles, *PostgresServer, *RabbitNode) {
	t.Helper()
	files := NewTLSFiles(t)
	var (
		db  *PostgresServer
		err error
		wg  sync.WaitGroup
	)
	wg.Go(func() {
		var stop func()
		db, stop, err = startPostgresTLS(files, pgSettings)
		t.Cleanup(stop)
	})
	node := StartRabbitNodeTLS(t, files)
	wg.Wait()
	if err != nil {
		if _, ok := errors.AsType[*missingError](err); ok {
			unavailable(t, "a private PostgreSQL server", err)
		}
		t.Fatalf("private PostgreSQL server with TLS: %v", err)
	}
	return files, db, node
}

// TLSURL is the URL of database db on a server of [StartPostgresTLS], by its certificate's
// host name, with sslmode=verify-full and nothing else: a client adds the CA and its client
// certificate (sslrootcert, sslcert, sslkey, or its own settings).
func (s *PostgresServer) TLSURL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=verify-full", TLSHost+":"+strconv.Itoa(s.Port), url.PathEscape(db))
}

// TLSFileParams are the URL parameters that give a PostgreSQL client the CA and the client
// certificate of f: "&sslrootcert=…&sslcert=…&sslkey=…", to append to [PostgresServer.TLSURL].
func (f *TLSFiles) TLSFileParams() string {
	return "&sslrootcert=" + url.QueryEscape(f.CAFile) + "&sslcert=" + url.QueryEscape(f.ClientCertFile) +
		"&sslkey=" + url.QueryEscape(f.ClientKeyFile)
}

// Package tlsfiles reads the services' TLS settings (the CA that signs a server's
// certificate, and optionally a client certificate and its key, each a PEM file named by a
// setting) into a tls.Config, and tells a certificate refused in a handshake from a peer
// that is not there.
//
// Every error names the setting and the file, never the content: a key file is a secret.
// The files are read once, when a process starts: after a certificate is rotated, restart
// the process (docs/runbook.md).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// Files are the paths of a TLS client's files; empty ones are not used.
type Files struct {
	// CA is the PEM file of the certificates that sign the server's: the client trusts them
	// instead of the system's roots.
	CA string
	// Cert and Key are the client certificate and its private key, for a server that asks
	// for one: both or neither.
	Cert, Key string
}

// Names are the settings that hold each of [Files], for errors.
type Names struct{ CA, Cert, Key string }

// NamesOf returns the names of the settings prefix+"CA_FILE", prefix+"CERT_FILE" and
// prefix+"KEY_FILE": what the services call them (ORDERS_AMQP_CA_FILE, …).
func NamesOf(prefix string) Names {
	return Names{CA: prefix + "CA_FILE", Cert: prefix + "CERT_FILE", Key: prefix + "KEY_FILE"}
}

// Set reports whether any file is given.
func (f Files) Set() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Config reads the files into a client's tls.Config: RootCAs from CA (the system's roots
// when it is empty), the client certificate from Cert and Key, TLS 1.2 at least. It
// returns nil and no error when no file is given.
func (f Files) Config(n Names) (*tls.Config, error) {
	if !f.Set() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	var errs []error
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", n.CA, err))
		default:
			c.RootCAs = x509.NewCertPool()
			if !c.RootCAs.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("%s: %s holds no PEM certificate", n.CA, f.CA))
			}
		}
	}
	switch {
	case f.Cert != "" && f.Key != "":
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			// The error of crypto/tls names the PEM blocks it found or missed, never their
			// content.
			errs = append(errs, fmt.Errorf("%s and %s: %s and %s are not a certificate and its key: %w", n.Cert, n.Key, f.Cert, f.Key, err))
		} else {
			c.Certificates = []tls.Certificate{cert}
		}
	case f.Cert != "":
		errs = append(errs, fmt.Errorf("%s is set without %s: give the client certificate's key too", n.Cert, n.Key))
	case f.Key != "":
		errs = append(errs, fmt.Errorf("%s is set without %s: give the client certificate too", n.Key, n.Cert))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Refused reports whether err is a TLS handshake that failed on a certificate: the
// client refused the server's (another CA, another host name, expired), or the server
// refused the client's or its lack of one (a TLS alert); or on a server that does not speak
// TLS at all (its first answer is no TLS record: a plain port). Waiting will not fix it,
// unlike a server that is down: a configuration, or a certificate, must change.
func Refused(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		return true
	}
	// crypto/tls returns an alert from the peer as a net.OpError of op "remote error".
	op, ok := errors.AsType[*net.OpError](err)
	return ok && op.Op == "remote error"
}

package outboxrabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// brokers is the list of broker URLs a client connects to, and whose turn is next.
//
// The list is tried round-robin from a random start. The first connection goes to a random
// node, so that many processes given the same list spread their connections over the
// cluster rather than all landing on its first node. Every later attempt, after a failed
// dial or a lost connection, takes the next URL in the list: a dead node costs one failed
// dial (a refused connection takes milliseconds), and every other node is tried before the
// dead one again. The outbox's publisher and the inbox's consumer connect the same way: this
// file is the outbox's, and tools/cmd/gencopies copies it into pkg/inbox/inboxrabbitmq.
type brokers struct {
	urls []string
	// names are host:port/vhost, for logs, errors and hooks: never the credentials.
	names []string
	// hosts are the URLs' hosts, the server names their certificates are checked for.
	hosts []string
	// tls is the config's TLSClientConfig, never modified: each dial gets a clone.
	tls *tls.Config

	mu   sync.Mutex
	next int
}

// parseBrokers checks a config's URL and URLs: exactly one of them set, every URL an
// amqp:// or amqps:// URI, and every URL amqps:// without TLS parameters of its own when
// the config has a TLSClientConfig (tlsConf). It returns every problem found.
func parseBrokers(single string, list []string, tlsConf *tls.Config) (*brokers, []error) {
	var errs []error
	urls := list
	switch {
	case single != "" && len(list) > 0:
		return nil, []error{errors.New("set URL or URLs, not both")}
	case single != "":
		urls = []string{single}
	case len(list) == 0:
		return nil, []error{errors.New("URL or URLs is required")}
	}
	b := &brokers{urls: make([]string, 0, len(urls)), names: make([]string, 0, len(urls)), tls: tlsConf}
	for i, u := range urls {
		field := "URL"
		if single == "" {
			field = "URLs[" + strconv.Itoa(i) + "]"
		}
		if u == "" {
			errs = append(errs, fmt.Errorf("%s is empty", field))
			continue
		}
		uri, err := amqp.ParseURI(u)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, redact(err)))
			continue
		}
		if tlsConf != nil && uri.Scheme != "amqps" {
			// amqp091-go would ignore the TLS config and connect in the clear.
			errs = append(errs, fmt.Errorf("%s is amqp://, which TLSClientConfig does not apply to: use amqps://", field))
			continue
		}
		if tlsConf != nil && (uri.CACertFile != "" || uri.CertFile != "" || uri.KeyFile != "" || uri.ServerName != "") {
			// amqp091-go would ignore them for TLSClientConfig.
			errs = append(errs, fmt.Errorf("%s has TLS parameters (cacertfile, certfile, keyfile or server_name_indication) "+
				"and TLSClientConfig is set, which replaces them: give them in one place", field))
			continue
		}
		b.urls = append(b.urls, u)
		b.names = append(b.names, brokerName(uri))
		b.hosts = append(b.hosts, uri.Host)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	b.next = rand.N(len(b.urls))
	return b, nil
}

// brokerName names a broker without its credentials: host:port, and the vhost unless it is
// the default one.
func brokerName(uri amqp.URI) string {
	name := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	if uri.Vhost != "/" {
		name += "/" + url.PathEscape(uri.Vhost)
	}
	return name
}

// tlsConfig is the TLS configuration of a connection to the broker of index i: a clone of
// the config's TLSClientConfig with the broker's host as its ServerName unless it has one,
// or nil (an amqps:// URL then gets amqp091-go's: the system's roots and the URL's
// parameters). A clone for each dial, because amqp091-go writes the ServerName it uses into
// the config it is given: a shared one would check every later broker's certificate
// against the first one's name.
func (b *brokers) tlsConfig(i int) *tls.Config {
	if b.tls == nil {
		return nil
	}
	c := b.tls.Clone()
	if c.ServerName == "" {
		c.ServerName = b.hosts[i]
	}
	return c
}

// redact drops the URL, which may hold a password, from a parse error, and what the parser
// quoted of it: a password written without its percent-encoding is what it stumbles on
// ("invalid port \":<password>\" after host"). internal/redact URLError, which this package
// cannot import.
func redact(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return errors.New(quoted.ReplaceAllString(err.Error(), ""))
}

// quoted is a double-quoted string of an error message, with the space before it.
var quoted = regexp.MustCompile(` ?"(?:[^"\\]|\\.)*"`)

// dialFunc connects to url, with tlsConf for an amqps:// one (brokers.tlsConfig), giving up
// at deadline.
type dialFunc func(url string, tlsConf *tls.Config, deadline time.Time) (*amqp.Connection, error)

// dial connects to the brokers in turn, each at most once, until one answers, and returns the
// connection and the broker's index in urls and names (-1 with an error). Each attempt gets at most perURL, and no more than an
// equal share of the time left before deadline (when not zero), so that a node that accepts
// connections but does not answer (a paused one) cannot use up the whole attempt. stop is
// checked between brokers: when it returns true, dial gives up.
func (b *brokers) dial(deadline time.Time, perURL time.Duration, stop func() bool, dial dialFunc) (*amqp.Connection, int, error) {
	n := len(b.urls)
	var failed []string
	// No wait between brokers: one attempt dials each at most once, and the caller backs off
	// between attempts (its outage backoff).
	for k := range n {
		i := b.take()
		until := time.Now().Add(perURL)
		if !deadline.IsZero() {
			if share := time.Now().Add(time.Until(deadline) / time.Duration(n-k)); share.Before(until) {
				until = share
			}
		}
		conn, err := dial(b.urls[i], b.tlsConfig(i), until)
		if err == nil {
			return conn, i, nil
		}
		if n == 1 {
			return nil, -1, err
		}
		if k == n-1 || stop() {
			return nil, -1, fmt.Errorf("no broker answered (%s%s: %w)", strings.Join(failed, ""), b.names[i], err)
		}
		failed = append(failed, b.names[i]+": "+err.Error()+"; ")
	}
	panic("unreachable")
}

// take returns the index of the URL whose turn it is, and moves the turn to the next one.
func (b *brokers) take() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.next
	b.next = (i + 1) % len(b.urls)
	return i
}

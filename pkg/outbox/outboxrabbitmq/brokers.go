package outboxrabbitmq

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
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

	mu   sync.Mutex
	next int
}

// parseBrokers checks a config's URL and URLs: exactly one of them set, every URL an
// amqp:// or amqps:// URI. It returns every problem found.
func parseBrokers(single string, list []string) (*brokers, []error) {
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
	b := &brokers{urls: make([]string, 0, len(urls)), names: make([]string, 0, len(urls))}
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
		b.urls = append(b.urls, u)
		b.names = append(b.names, brokerName(uri))
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

// redact drops the URL, which may hold a password, from a parse error.
func redact(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// dialFunc connects to url, giving up at deadline.
type dialFunc func(url string, deadline time.Time) (*amqp.Connection, error)

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
		conn, err := dial(b.urls[i], until)
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

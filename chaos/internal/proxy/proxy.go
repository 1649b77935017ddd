// Package proxy is a TCP proxy that can break the network between its clients and a server on
// purpose: [Proxy.Cut] drops every connection and refuses new ones, [Proxy.Delay] holds every
// chunk of data for a while before passing it on, [Proxy.Heal] ends both.
//
// The chaos runner puts one between the services and RabbitMQ: every service connects to the
// broker through it, so a cut looks to them like a network partition, and a delay like a
// congested link, while the broker itself stays up.
package proxy

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what the proxy did, so that a test can prove a fault reached someone.
type Stats struct {
	// Accepted counts client connections passed on to the target.
	Accepted int64
	// Refused counts client connections closed at once because the network was cut (or the
	// target could not be reached).
	Refused int64
	// Cut counts open connections dropped by Cut.
	Cut int64
	// Delayed counts chunks of data held back by a delay, in either direction.
	Delayed int64
	// Bytes counts bytes forwarded, in both directions.
	Bytes int64
}

// Proxy forwards TCP connections from its listener to a target address. Create it with
// [Listen]; its zero value is not usable.
type Proxy struct {
	ln     net.Listener
	target string
	dialer net.Dialer

	mu    sync.Mutex
	cut   bool
	delay time.Duration
	links map[*link]struct{}
	// changed is closed (and replaced) whenever cut or delay change, so that a chunk held
	// back by a delay is let go at once by Heal; dropped is closed (and replaced) by Cut and
	// Close, which abandon the connections being set up.
	changed chan struct{}
	dropped chan struct{}
	closed  bool

	accepted, refused, cuts, delayed, bytes atomic.Int64
	wg                                      sync.WaitGroup
}

// link is one client connection and its connection to the target.
type link struct{ client, server net.Conn }

func (l *link) close() {
	_ = l.client.Close()
	_ = l.server.Close()
}

// Listen starts a proxy listening on addr ("127.0.0.1:0" for any free port) that forwards to
// target ("host:port").
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		ln: ln, target: target, links: map[*link]struct{}{}, changed: make(chan struct{}), dropped: make(chan struct{}),
		dialer: net.Dialer{Timeout: 5 * time.Second},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to ("127.0.0.1:41234").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut drops every open connection and refuses new ones until [Proxy.Heal]. It returns how
// many connections it dropped.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	p.cut = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.notifyLocked()
	p.dropLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	p.cuts.Add(int64(len(links)))
	return len(links)
}

// Delay holds every chunk of data read from either side for d before writing it to the
// other, until [Proxy.Heal]. A zero d ends the delay.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
	p.notifyLocked()
}

// Heal ends a cut and a delay: new connections go through again, held chunks are let go.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.delay = false, 0
	p.notifyLocked()
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.accepted.Load(), Refused: p.refused.Load(), Cut: p.cuts.Load(),
		Delayed: p.delayed.Load(), Bytes: p.bytes.Load(),
	}
}

// Close stops listening, drops every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.notifyLocked()
	p.dropLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) dropLocked() {
	close(p.dropped)
	p.dropped = make(chan struct{})
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		cut, closed := p.cut, p.closed
		p.mu.Unlock()
		if cut || closed {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // Close and Cut interrupt a dial in progress
		p.mu.Lock()
		ch := p.dropped
		p.mu.Unlock()
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	server, err := p.dialer.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		p.refused.Add(1)
		_ = client.Close()
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		p.refused.Add(1)
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)

	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, server, client) })
	wg.Go(func() { p.pipe(l, client, server) })
	wg.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe copies src to dst chunk by chunk, holding each chunk back while a delay is set, until
// either side fails; then it closes both, so that the other direction ends too.
func (p *Proxy) pipe(l *link, dst io.Writer, src io.Reader) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			p.bytes.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
}

// hold waits out the current delay, if any. It returns false when the proxy was cut or
// closed meanwhile: the chunk must not be passed on.
func (p *Proxy) hold() bool {
	p.mu.Lock()
	d, changed, gone := p.delay, p.changed, p.cut || p.closed
	p.mu.Unlock()
	if gone {
		return false
	}
	if d <= 0 {
		return true
	}
	p.delayed.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed: // healed, cut or closed: decide again without waiting
	}
	p.mu.Lock()
	gone = p.cut || p.closed
	p.mu.Unlock()
	return !gone
}

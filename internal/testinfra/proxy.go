package testinfra

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of a server. Cut drops every connection and refuses new ones
// (the server looks dead to clients); Heal lets connections through again. Stall holds back
// everything the server sends while the connections stay open (the server looks hung, as a
// broker under a resource alarm or behind a black-holed network does); Freeze also stops
// reading what the clients send, so that their writes block once the socket buffers are
// full; Resume ends both and delivers what was held.
// Tests use it to take a shared broker away from the code under test without touching the
// broker itself.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	flowing *sync.Cond // signalled when stalled or cut changes
	cut     bool
	stalled bool
	frozen  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	dials   atomic.Int64
}

// NewProxy listens on a free local port and forwards to target ("host:port"). It is closed
// when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.flowing = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// RewriteURL returns rawURL with its host replaced by the proxy's address.
func (p *Proxy) RewriteURL(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %q: %v", rawURL, err)
	}
	u.Host = p.Addr()
	return u.String()
}

// Dials is how many connections clients have opened to the proxy so far, those refused while
// it was cut included: the tests of a loop that reconnects count its attempts with it.
func (p *Proxy) Dials() int64 { return p.dials.Load() }

// Cut closes every open connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.flowing.Broadcast()
}

// Stall holds back every byte the server sends until Resume; the client's bytes still reach
// the server.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Freeze stops forwarding in both directions until Resume: the proxy reads at most one
// more chunk from each side, so a client writing to the server blocks once its socket
// buffers are full.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Resume delivers what Stall or Freeze held back and lets bytes through again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.stalled, p.frozen = false, false
	p.flowing.Broadcast()
	p.mu.Unlock()
}

// waitFlowing blocks while server-to-client traffic is stalled or frozen, unless the proxy
// is cut.
func (p *Proxy) waitFlowing() {
	p.mu.Lock()
	for (p.stalled || p.frozen) && !p.cut {
		p.flowing.Wait()
	}
	p.mu.Unlock()
}

// waitThawed blocks while the proxy is frozen, unless it is cut.
func (p *Proxy) waitThawed() {
	p.mu.Lock()
	for p.frozen && !p.cut {
		p.flowing.Wait()
	}
	p.mu.Unlock()
}

// Heal lets new connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.dials.Add(1)
		if !p.track(client) {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil || !p.track(server) {
			if server != nil {
				_ = server.Close()
			}
			p.untrack(client)
			continue
		}
		p.wg.Add(2)
		go p.pipe(server, client, p.waitThawed)
		go p.pipe(client, server, p.waitFlowing)
	}
}

// pipe copies src to dst; gate, if set, is called before each write and may block.
func (p *Proxy) pipe(dst, src net.Conn, gate func()) {
	defer p.wg.Done()
	defer p.untrack(src)
	defer p.untrack(dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if gate != nil {
				gate()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

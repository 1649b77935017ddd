package outboxrabbitmq

import (
	"context"
	"net"
	"sync"
)

// guard closes the socket in use when the deadline of the call under way passes. That ends
// every step amqp091-go could be stuck in: a socket write to a broker that stopped reading, an
// RPC it never answers (channel.open, confirm.select, Setup's declarations), the handshake.
type guard struct {
	mu    sync.Mutex
	call  uint64 // counts arm calls: a late fire of an earlier call must not close anything
	armed bool
	fired bool
	raw   net.Conn
}

// arm starts watching ctx. The returned disarm reports whether the deadline closed the
// socket during the call.
func (g *guard) arm(ctx context.Context) (disarm func() bool) {
	g.mu.Lock()
	g.call++
	call := g.call
	g.armed, g.fired = true, false
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { g.fire(call) })
	return func() bool {
		stop()
		g.mu.Lock()
		defer g.mu.Unlock()
		g.armed = false
		return g.fired
	}
}

// use makes raw the socket the guard closes; at once if the deadline already passed.
func (g *guard) use(raw net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.raw = raw
	if g.armed && g.fired {
		_ = raw.Close()
	}
}

func (g *guard) fire(call uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed || g.call != call {
		return
	}
	g.fired = true
	if g.raw != nil {
		_ = g.raw.Close()
	}
}

func (g *guard) hasFired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.armed && g.fired
}

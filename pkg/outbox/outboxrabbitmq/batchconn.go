package outboxrabbitmq

import (
	"fmt"
	"net"
	"sync"
)

// batchedConnMaxPending bounds the bytes a batchedConn holds that are not yet in write(2):
// past it, Write waits for the writer, as amqp091-go waited for the socket before.
const batchedConnMaxPending = 256 << 10

// batchedConn is the socket under a publisher's AMQP connection. Its Write copies the bytes
// into a buffer and returns; one goroutine of its own writes the buffer out. amqp091-go
// flushes its own buffer after every publish's frames, which made one write(2) per message,
// the largest share of a relay's own CPU in the drain's profile. Here, while that goroutine
// is in write(2) the next messages' frames gather, and go out together in the next one.
//
// Nothing waits for a timer: bytes are written as soon as the writer is free, so a lone
// publish or a heartbeat leaves at once, and under load each write(2) carries what came in
// during the one before.
//
// What a failure does: the first error of write(2) is kept, closes the socket (amqp091-go's
// reader then fails and closes the connection, settling its pending confirms as nacks, as
// if its own write had failed), and is returned by every later Write. So a Write that
// returned nil does not promise that its bytes reached the socket; nothing relies on that: a
// message counts as sent only when its confirm arrives. A socket that stops taking bytes (a
// broker that no longer reads) fills the buffer, and then Write waits, until the guard
// closes the socket at the caller's deadline, as before.
type batchedConn struct {
	net.Conn

	wake chan struct{} // a token: pending has bytes, or the conn closed
	done chan struct{} // closed when the writer has returned

	mu      sync.Mutex
	room    *sync.Cond // pending was taken, or err was set
	pending []byte     // what Write has copied and the writer has not taken
	spare   []byte     // the writer's last buffer, reused
	err     error      // set once: the socket's write error, or net.ErrClosed after Close
}

func newBatchedConn(c net.Conn) *batchedConn {
	b := &batchedConn{Conn: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	b.room = sync.NewCond(&b.mu)
	go b.writeLoop()
	return b
}

// Write copies p for the writer, waiting while batchedConnMaxPending bytes are pending.
func (b *batchedConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	for b.err == nil && len(b.pending) >= batchedConnMaxPending {
		b.room.Wait()
	}
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return 0, err
	}
	b.pending = append(b.pending, p...)
	b.mu.Unlock()
	b.poke()
	return len(p), nil
}

func (b *batchedConn) poke() {
	select {
	case b.wake <- struct{}{}:
	default: // a token is there already: the writer will look at pending again
	}
}

// Close closes the socket; bytes still pending are dropped, as a closing socket drops them.
func (b *batchedConn) Close() error {
	b.fail(net.ErrClosed)
	return b.Conn.Close()
}

// fail keeps err as the conn's error unless it has one, and wakes everything waiting.
func (b *batchedConn) fail(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.pending = nil
	b.room.Broadcast()
	b.mu.Unlock()
	b.poke()
}

func (b *batchedConn) writeLoop() {
	defer close(b.done)
	for range b.wake {
		b.mu.Lock()
		if b.err != nil {
			b.mu.Unlock()
			return
		}
		if len(b.pending) == 0 {
			b.mu.Unlock()
			continue
		}
		// Two buffers take turns, and never alias: Write appends to one while this
		// writes the other.
		buf := b.pending
		b.pending, b.spare = b.spare[:0], nil
		b.room.Broadcast()
		b.mu.Unlock()
		if _, err := b.Conn.Write(buf); err != nil {
			b.fail(fmt.Errorf("write to the broker: %w", err))
			_ = b.Conn.Close()
			return
		}
		b.mu.Lock()
		b.spare = buf[:0]
		b.mu.Unlock()
	}
}

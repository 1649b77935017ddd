package outboxrabbitmq

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	select {
	case server = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
	}
	require.NotNil(t, server)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

func waitDone(t *testing.T, b *batchedConn) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the batchedConn's writer did not return")
	}
}

// TestBatchedConn: every byte written arrives once and in the order of the Writes, however
// many goroutines write at once and whatever their sizes (several writers as amqp091-go's
// own lock would never allow, frames larger than the pending bound); a failed socket fails
// the Writes after it; a socket that takes nothing holds Write back until Close.
func TestBatchedConn(t *testing.T) {
	t.Run("StreamIntact", func(t *testing.T) {
		client, server := tcpPair(t)
		b := newBatchedConn(client)
		const writers, perWriter = 4, 5000
		// Each record: writer, sequence, length, then length bytes of a pattern of both.
		// A Write is one record, as amqp091-go's flush is one message's frames.
		got := make(chan error, 1)
		go func() {
			r := bufio.NewReader(server)
			next := make([]uint32, writers)
			for n := 0; n < writers*perWriter; n++ {
				var h [12]byte
				if _, err := io.ReadFull(r, h[:]); err != nil {
					got <- fmt.Errorf("record %d: %w", n, err)
					return
				}
				w, seq, size := binary.BigEndian.Uint32(h[0:]), binary.BigEndian.Uint32(h[4:]), binary.BigEndian.Uint32(h[8:])
				if w >= writers || seq != next[w] {
					got <- fmt.Errorf("record %d: writer %d sequence %d, want %d", n, w, seq, next[w])
					return
				}
				next[w]++
				body := make([]byte, size)
				if _, err := io.ReadFull(r, body); err != nil {
					got <- fmt.Errorf("record %d body: %w", n, err)
					return
				}
				if !bytes.Equal(body, pattern(w, seq, int(size))) {
					got <- fmt.Errorf("record %d (writer %d, sequence %d): body corrupted", n, w, seq)
					return
				}
			}
			got <- nil
		}()
		var wg sync.WaitGroup
		for w := range uint32(writers) {
			wg.Go(func() {
				for seq := range uint32(perWriter) {
					size := int(seq*7919%1500) + 1
					if seq%500 == 0 {
						size = batchedConnMaxPending + 1000 // one Write larger than the bound
					}
					rec := make([]byte, 12, 12+size)
					binary.BigEndian.PutUint32(rec[0:], w)
					binary.BigEndian.PutUint32(rec[4:], seq)
					binary.BigEndian.PutUint32(rec[8:], uint32(size))
					rec = append(rec, pattern(w, seq, size)...)
					n, err := b.Write(rec)
					if err != nil || n != len(rec) {
						t.Errorf("Write: %d of %d bytes, %v", n, len(rec), err)
						return
					}
					clear(rec) // the conn must have copied it
				}
			})
		}
		wg.Wait()
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Fatal("the reader did not get every record")
		}
		require.NoError(t, b.Close())
		waitDone(t, b)
		_, err := b.Write([]byte("x"))
		require.ErrorIs(t, err, net.ErrClosed, "a Write after Close")
	})

	t.Run("SocketFails", func(t *testing.T) {
		client, server := tcpPair(t)
		b := newBatchedConn(client)
		require.NoError(t, server.Close())
		// The peer is gone: write(2) fails within a few writes (a reset), and every Write
		// after that returns the error.
		var err error
		deadline := time.Now().Add(10 * time.Second)
		for err == nil && time.Now().Before(deadline) {
			_, err = b.Write(make([]byte, 64<<10))
		}
		require.Error(t, err, "Writes to a closed peer kept succeeding")
		require.NotErrorIs(t, err, net.ErrClosed, "the socket's own error, not Close's: %v", err)
		waitDone(t, b)
		_, err2 := b.Write([]byte("x"))
		require.Equal(t, err, err2, "the first error is kept")
	})

	t.Run("PeerStopsReading", func(t *testing.T) {
		client, _ := tcpPair(t) // the server end never reads
		b := newBatchedConn(client)
		blocked := make(chan error, 1)
		go func() {
			// Fills the socket's buffers, then the pending bound: Write has to wait.
			for {
				if _, err := b.Write(make([]byte, 64<<10)); err != nil {
					blocked <- err
					return
				}
			}
		}()
		// Write blocks once the kernel's buffers and the pending bound are full; Close (what the
		// publisher's guard does at the caller's deadline) releases it with an error.
		require.Eventually(t, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.pending) >= batchedConnMaxPending
		}, 10*time.Second, time.Millisecond, "the pending bytes never reached the bound")
		select {
		case err := <-blocked:
			t.Fatalf("Write returned %v while the peer read nothing", err)
		default:
		}
		require.NoError(t, b.Close())
		select {
		case err := <-blocked:
			require.ErrorIs(t, err, net.ErrClosed)
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not release a waiting Write")
		}
		waitDone(t, b)
	})
}

func pattern(w, seq uint32, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(uint32(i) + w*31 + seq*17)
	}
	return p
}

// TestPublisherBatchesWrites: the publisher's connections run on a batchedConn, and a lone
// message is confirmed through it (nothing waits for more to come).
func TestPublisherBatchesWrites(t *testing.T) {
	url := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, url)
	pub, err := New(Config{URL: url, Connections: 2})
	require.NoError(t, err)
	defer pub.Close()
	for range 3 {
		m := outbox.Message{ID: uuid.New(), Exchange: top.Exchange, RoutingKey: "k", Type: "T",
			AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`), CreatedAt: time.Now()}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		errs := pub.Publish(ctx, []outbox.Message{m})
		cancel()
		require.NoError(t, errs[0])
	}
	for _, l := range pub.lanes {
		if l.sess == nil {
			continue // a lane not used yet
		}
		_, ok := l.sess.raw.(*batchedConn)
		require.True(t, ok, "the lane's socket is a %T", l.sess.raw)
	}
}

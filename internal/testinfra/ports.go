package testinfra

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// FreePort returns a TCP port on 127.0.0.1 that nobody listened on a moment ago and that
// it has not returned before, for a server started later.
//
// It is chosen below the kernel's ephemeral range: a port from that range (what listening
// on port 0 gives) can be taken, between the check and the server's bind, as the local port
// of any outgoing connection on the machine — and a test makes thousands — and the server
// then fails with "address already in use" at every restart. Only when no port below the
// range is free does it fall back to one from the range.
//
// A port it returned is never returned again in this process: the check sees only servers
// already listening, and the servers bind their ports seconds after they were chosen (after
// initdb, after a cluster's other nodes start). Two of them given one port would
// leave the later one failing (or restarting for ever) on "address already in use".
func FreePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, _ := ephemeralPorts()
	if lo > minPrivatePort+100 {
		for range 50 {
			port := minPrivatePort + rand.IntN(lo-minPrivatePort)
			if portsGiven[port] {
				continue
			}
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				continue
			}
			_ = ln.Close()
			portsGiven[port] = true
			return port, nil
		}
	}
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !portsGiven[port] {
			portsGiven[port] = true
			return port, nil
		}
	}
	return 0, errors.New("find a free port: every port tried was given before")
}

// portsGiven are the ports FreePort returned, under portsMu.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// minPrivatePort is the lowest port FreePort picks: above the well-known and most
// registered ones.
const minPrivatePort = 20000

// ephemeralPorts returns the kernel's range of ports for outgoing connections (Linux's
// defaults when it cannot be read).
func ephemeralPorts() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l <= 0 || h < l {
		return lo, hi
	}
	return l, h
}

package pgdb

import (
	"net"
	"syscall"
	"time"
)

// deadPeerDialer dials the server's TCP connections so that a server gone silent is given up
// on after about d (Config.DeadPeerTimeout): keepalive probes on an idle connection (the
// first after d/2, then every d/4, two unanswered close it), and a bound on how long data
// sent may go unacknowledged (setUserTimeout). Unix sockets are dialled as they are.
func deadPeerDialer(d time.Duration) *net.Dialer {
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: d / 2, Interval: d / 4, Count: 2},
		Control: func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil
			}
			var serr error
			if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, d) }); err != nil {
				return err
			}
			return serr
		},
	}
}
